//! Every symbol NCCL 2.28.9's `libnccl.so.2` exports, each with its place in the table of the
//! real NCCL's functions (the `pnccl*` names are NCCL's own aliases of the same functions, as
//! MPI's `PMPI_*` are: tools in front of NCCL call them to reach NCCL itself).

/// Every symbol exported, in one list, by how it is exported: `typed`, a Rust function of
/// [`crate::ffi::typed`] (the calls this library reads, holds or serves); `jumped`, a tail jump of
/// [`crate::ffi::trampolines`] (every other). Invokes `$then!` with both lists, so that the table
/// ([`Export`]) and the trampolines come from this one list.
macro_rules! export_list {
    ($then:ident) => {
        $then! {
            typed: ncclAllGather,
                ncclAllReduce,
                ncclAlltoAll,
                ncclBcast,
                ncclBroadcast,
                ncclCommAbort,
                ncclCommDeregister,
                ncclCommDestroy,
                ncclCommFinalize,
                ncclCommGetAsyncError,
                ncclCommInitAll,
                ncclCommInitRank,
                ncclCommInitRankConfig,
                ncclCommInitRankScalable,
                ncclCommRegister,
                ncclCommShrink,
                ncclCommSplit,
                ncclCommWindowDeregister,
                ncclCommWindowRegister,
                ncclGather,
                ncclGetErrorString,
                ncclGetLastError,
                ncclGroupEnd,
                ncclGroupSimulateEnd,
                ncclGroupStart,
                ncclRecv,
                ncclReduce,
                ncclReduceScatter,
                ncclScatter,
                ncclSend;
            jumped: ncclCommCount,
                ncclCommCuDevice,
                ncclCommRevoke,
                ncclCommUserRank,
                ncclDevCommCreate,
                ncclDevCommDestroy,
                ncclGetUniqueId,
                ncclGetVersion,
                ncclGinBarrierCreateRequirement,
                ncclLLA2ACalcSlots,
                ncclLLA2ACreateRequirement,
                ncclLsaBarrierCreateRequirement,
                ncclMemAlloc,
                ncclMemFree,
                ncclRedOpCreatePreMulSum,
                ncclRedOpDestroy,
                ncclResetDebugInit,
                ncclResetDebugInitInternal,
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
                pncclTeamWorld;
        }
    };
}
pub(crate) use export_list;

/// Declares [`Export`] (one variant per exported name, in the table's order) and [`NAMES`].
macro_rules! exports {
    (typed: $($typed:ident),*; jumped: $($jumped:ident),*;) => {
        /// One exported symbol, by its C name; `as usize` is its place in the table.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Export { $($typed,)* $($jumped),* }

        /// Every exported name, in [`Export`]'s order.
        pub const NAMES: &[&str] = &[$(stringify!($typed),)* $(stringify!($jumped)),*];

        /// Every export, in its order: `ALL[export as usize] == export`.
        pub const ALL: &[Export] = &[$(Export::$typed,)* $(Export::$jumped),*];

        /// The exports written out in Rust ([`crate::ffi::typed`]); the others are jumped through.
        pub const TYPED: &[Export] = &[$(Export::$typed),*];
    };
}

export_list!(exports);

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
    fn every_typed_export_is_declared_and_every_other_jumped_through() {
        let declared: Vec<&str> = crate::ffi::typed::SIGNATURES
            .iter()
            .map(|(name, _, _)| *name)
            .collect();
        for export in TYPED {
            assert!(declared.contains(&export.name()), "{export:?}");
        }
        assert_eq!(TYPED.len(), 30);
        assert!(!TYPED.contains(&Export::ncclCommCount));
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
