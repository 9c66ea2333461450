//! Every symbol NCCL 2.28.9's `libnccl.so.2` exports, each with its place in the table of the
//! real NCCL's functions (the `pnccl*` names are NCCL's own aliases of the same functions, as
//! MPI's `PMPI_*` are: tools in front of NCCL call them to reach NCCL itself).

/// Declares [`Export`] (one variant per exported name, in the table's order) and [`NAMES`].
macro_rules! exports {
    ($($name:ident),* $(,)?) => {
        /// One exported symbol, by its C name; `as usize` is its place in the table.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Export { $($name),* }

        /// Every exported name, in [`Export`]'s order.
        pub const NAMES: &[&str] = &[$(stringify!($name)),*];

        /// Every export, in its order: `ALL[export as usize] == export`.
        pub const ALL: &[Export] = &[$(Export::$name),*];
    };
}

exports! {
    ncclAllGather,
    ncclAllReduce,
    ncclAlltoAll,
    ncclBcast,
    ncclBroadcast,
    ncclCommAbort,
    ncclCommCount,
    ncclCommCuDevice,
    ncclCommDeregister,
    ncclCommDestroy,
    ncclCommFinalize,
    ncclCommGetAsyncError,
    ncclCommInitAll,
    ncclCommInitRank,
    ncclCommInitRankConfig,
    ncclCommInitRankScalable,
    ncclCommRegister,
    ncclCommRevoke,
    ncclCommShrink,
    ncclCommSplit,
    ncclCommUserRank,
    ncclCommWindowDeregister,
    ncclCommWindowRegister,
    ncclDevCommCreate,
    ncclDevCommDestroy,
    ncclGather,
    ncclGetErrorString,
    ncclGetLastError,
    ncclGetUniqueId,
    ncclGetVersion,
    ncclGinBarrierCreateRequirement,
    ncclGroupEnd,
    ncclGroupSimulateEnd,
    ncclGroupStart,
    ncclLLA2ACalcSlots,
    ncclLLA2ACreateRequirement,
    ncclLsaBarrierCreateRequirement,
    ncclMemAlloc,
    ncclMemFree,
    ncclRecv,
    ncclRedOpCreatePreMulSum,
    ncclRedOpDestroy,
    ncclReduce,
    ncclReduceScatter,
    ncclResetDebugInit,
    ncclResetDebugInitInternal,
    ncclScatter,
    ncclSend,
    ncclTeamLsa,
    ncclTeamRail,
    ncclTeamRankToLsa,
    ncclTeamRankToWorld,
    ncclTeamWorld,
    pncclAllGather,
    pncclAllReduce,
    pncclAlltoAll,
    pncclBcast,
    pncclBroadcast,
    pncclCommAbort,
    pncclCommCount,
    pncclCommCuDevice,
    pncclCommDeregister,
    pncclCommDestroy,
    pncclCommFinalize,
    pncclCommGetAsyncError,
    pncclCommInitAll,
    pncclCommInitRank,
    pncclCommInitRankConfig,
    pncclCommInitRankScalable,
    pncclCommRegister,
    pncclCommRevoke,
    pncclCommShrink,
    pncclCommSplit,
    pncclCommUserRank,
    pncclCommWindowDeregister,
    pncclCommWindowRegister,
    pncclDevCommCreate,
    pncclDevCommDestroy,
    pncclGather,
    pncclGetErrorString,
    pncclGetLastError,
    pncclGetUniqueId,
    pncclGetVersion,
    pncclGinBarrierCreateRequirement,
    pncclGroupEnd,
    pncclGroupSimulateEnd,
    pncclGroupStart,
    pncclLLA2ACalcSlots,
    pncclLLA2ACreateRequirement,
    pncclLsaBarrierCreateRequirement,
    pncclMemAlloc,
    pncclMemFree,
    pncclRecv,
    pncclRedOpCreatePreMulSum,
    pncclRedOpDestroy,
    pncclReduce,
    pncclReduceScatter,
    pncclResetDebugInit,
    pncclScatter,
    pncclSend,
    pncclTeamLsa,
    pncclTeamRail,
    pncclTeamRankToLsa,
    pncclTeamRankToWorld,
    pncclTeamWorld,
}

/// How many symbols are exported (and so the size of the table of the real NCCL's functions).
pub const COUNT: usize = NAMES.len();

impl Export {
    /// The symbol's C name.
    pub fn name(self) -> &'static str {
        NAMES[self as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_once_in_the_table_at_its_variants_place() {
        let mut sorted = NAMES.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), COUNT);
        assert_eq!(Export::ncclAllReduce.name(), "ncclAllReduce");
        assert_eq!(Export::pncclTeamWorld.name(), "pncclTeamWorld");
        assert!(ALL
            .iter()
            .enumerate()
            .all(|(index, export)| *export as usize == index));
    }

    #[test]
    fn each_nccl_function_has_its_pnccl_alias() {
        for name in NAMES.iter().filter(|name| name.starts_with("nccl")) {
            // NCCL's one internal export, the target of ncclResetDebugInit, has no alias.
            if *name != "ncclResetDebugInitInternal" {
                assert!(NAMES.contains(&format!("p{name}").as_str()), "{name}");
            }
        }
    }
}
