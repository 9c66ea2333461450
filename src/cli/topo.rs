//! `peerlink topo`: the host's topology, and with `--nccl` or `--nccl-xml` NCCL's view beside it.

use super::args::{Global, TopoArgs};
use anyhow::Result;
use peerlink::document::topo::TopoDocument;
use peerlink::launch::nccl_topology;
use peerlink::report;
use peerlink::topology::nccl_view::{self, NcclView};

pub fn run(global: &Global, args: &TopoArgs) -> Result<()> {
    if let Some(path) = &args.nccl_lib {
        peerlink::backend::cuda::prefer_nccl_library(path);
    }
    let opened = global.open()?;
    let topo = opened.backend.topology();
    let selected = topo.select(global.devices.as_deref())?;
    // Made only for NCCL's view: a copy of the pairs, which grow with the square of the GPUs.
    let shown = || topo.restricted_to(&selected);
    let nccl = match (&args.nccl_xml, args.nccl) {
        (Some(file), _) => {
            let text = nccl_view::read_dump(file)?;
            Some(NcclView::compare(
                &text,
                &file.display().to_string(),
                &shown(),
            )?)
        }
        (None, true) => {
            let (text, file) = nccl_topology::run_nccl(opened.backend.as_ref(), &selected)?;
            let source = format!(
                "NCCL run by peerlink (NCCL_TOPO_DUMP_FILE={})",
                file.display()
            );
            Some(NcclView::compare(&text, &source, &shown())?)
        }
        (None, false) => None,
    };
    let mut doc = TopoDocument::new(topo, &selected);
    doc.nccl = nccl;
    global.print(&doc, || report::topo::text(&doc))
}
