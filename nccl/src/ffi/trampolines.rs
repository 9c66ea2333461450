//! Every export this library does not read: a tail jump through its slot to the real NCCL's
//! function, which therefore receives the caller's registers and stack exactly as they were, for
//! any signature (structures by value included). The slot's first call goes to
//! [`resolve_for_trampoline`] with every argument register saved around it.
//!
//! Why assembly: Rust cannot declare a function "of any signature" that forwards its arguments;
//! re-declaring each from headers (some only in the device API's C++ headers) would be a second
//! copy of NCCL's API to keep right for no gain, since this library reads none of these calls.

// Their safety contract is NCCL's documentation of each function, which the caller keeps.
#![allow(clippy::missing_safety_doc)]

use super::{resolve_for_trampoline, SLOTS};
use crate::exports::Export;

/// One naked function per name: jump to the slot's address if resolved; else save the argument
/// registers (rdi, rsi, rdx, rcx, r8, r9, rax — the vector count of variadic calls — and
/// xmm0–xmm7), ask [`resolve_for_trampoline`], restore them and jump to its answer. r11 is free
/// at a call (the System V ABI's scratch register). Seven pushes after the return address leave
/// the stack 16-byte aligned for the call, as the ABI needs.
macro_rules! trampolines {
    (typed: $($typed:ident),*; jumped: $($name:ident),*;) => {$(
        #[unsafe(no_mangle)]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name() {
            core::arch::naked_asm!(
                "mov r11, qword ptr [rip + {slots} + {offset}]",
                "cmp r11, 1",
                "jbe 2f",
                "jmp r11",
                "2:",
                "push rdi", "push rsi", "push rdx", "push rcx", "push r8", "push r9", "push rax",
                "sub rsp, 128",
                "movdqu xmmword ptr [rsp], xmm0",
                "movdqu xmmword ptr [rsp + 16], xmm1",
                "movdqu xmmword ptr [rsp + 32], xmm2",
                "movdqu xmmword ptr [rsp + 48], xmm3",
                "movdqu xmmword ptr [rsp + 64], xmm4",
                "movdqu xmmword ptr [rsp + 80], xmm5",
                "movdqu xmmword ptr [rsp + 96], xmm6",
                "movdqu xmmword ptr [rsp + 112], xmm7",
                "mov edi, {index}",
                "call {resolve}",
                "mov r11, rax",
                "movdqu xmm0, xmmword ptr [rsp]",
                "movdqu xmm1, xmmword ptr [rsp + 16]",
                "movdqu xmm2, xmmword ptr [rsp + 32]",
                "movdqu xmm3, xmmword ptr [rsp + 48]",
                "movdqu xmm4, xmmword ptr [rsp + 64]",
                "movdqu xmm5, xmmword ptr [rsp + 80]",
                "movdqu xmm6, xmmword ptr [rsp + 96]",
                "movdqu xmm7, xmmword ptr [rsp + 112]",
                "add rsp, 128",
                "pop rax", "pop r9", "pop r8", "pop rcx", "pop rdx", "pop rsi", "pop rdi",
                "jmp r11",
                slots = sym SLOTS,
                offset = const Export::$name as usize * 8,
                index = const Export::$name as usize,
                resolve = sym resolve_for_trampoline,
            )
        }
    )*};
}

crate::exports::export_list!(trampolines);
