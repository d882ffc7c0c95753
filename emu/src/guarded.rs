//! Copies and atomics on application memory that fail, instead of killing the process, when
//! the memory is no longer there.
//!
//! A NIC keeps an MR's pages pinned: an application that unmaps registered memory (or
//! truncates the file under a file-backed MR) loses sight of the pages, but no DMA faults. The
//! emulator touches the application's addresses themselves, so such an access would end the
//! process with `SIGSEGV` or `SIGBUS` — the responder of a peer's WRITE included, which did
//! nothing wrong at the moment of the access. Instead every access to application memory runs
//! through the few instructions below, and a fault inside them is recovered the way an
//! operating system recovers a fault in its copy from user space: a `SIGSEGV`/`SIGBUS` handler
//! that finds the faulting instruction among them resumes at a landing pad that returns
//! failure. The engine then treats the access as it treats memory an on-demand paging MR
//! cannot bring in: the operation fails with an access error (`docs/verbs.md`).
//!
//! Faults anywhere else are passed to the handler that was installed before ours (or to the
//! default action), so a program's own crashes and handlers are unchanged. A handler the
//! program installs after ours takes the signal first; then a fault in these instructions is
//! its to handle (the emulator's accesses crash as they would without this module).
#![allow(unsafe_code)]

/// Copies `len` bytes from `src` to `dst` (the ranges may overlap); false if either range
/// faulted part-way (what was copied before stays).
///
/// # Safety
/// The ranges must not be memory Rust code holds references into; a range that is unmapped
/// or lacks the access is allowed (that is the point).
pub(crate) unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) -> bool {
    // (An empty copy the routine makes itself.)
    if std::ptr::eq(src, dst) {
        return true;
    }
    // SAFETY: the routine touches only the two ranges; a fault returns 1 through the handler.
    unsafe { arch::copy(dst, src, len) == 0 }
}

/// Atomically adds `add` to the word at `p`; its old value, or `None` if `p` faulted.
///
/// # Safety
/// `p` must be 8-byte aligned; it may be unmapped or read-only.
pub(crate) unsafe fn fetch_add(p: *mut u64, add: u64) -> Option<u64> {
    let mut old = 0;
    // SAFETY: as `copy`; `old` is ours.
    (unsafe { arch::fetch_add(p, add, &mut old) } == 0).then_some(old)
}

/// Atomically replaces the word at `p` with `swap` if it equals `compare`; its old value, or
/// `None` if `p` faulted.
///
/// # Safety
/// As [`fetch_add`].
pub(crate) unsafe fn compare_swap(p: *mut u64, compare: u64, swap: u64) -> Option<u64> {
    let mut old = 0;
    // SAFETY: as `copy`; `old` is ours.
    (unsafe { arch::compare_swap(p, compare, swap, &mut old) } == 0).then_some(old)
}

/// Stores `word` at `p` as one access; false if `p` faulted.
///
/// # Safety
/// As [`fetch_add`].
pub(crate) unsafe fn store(p: *mut u64, word: u64) -> bool {
    // SAFETY: as `copy`.
    unsafe { arch::store(p, word) == 0 }
}

/// Whether the `len` bytes at `src` (a multiple of 32) hold anything but zeros; `None` if
/// they faulted.
///
/// # Safety
/// As [`copy`]'s source.
pub(crate) unsafe fn any_set(src: *const u8, len: usize) -> Option<bool> {
    debug_assert!(len.is_multiple_of(32), "{len} bytes");
    // SAFETY: as `copy`.
    match unsafe { arch::any_set(src, len) } {
        0 => Some(false),
        1 => None,
        _ => Some(true),
    }
}

/// Makes the handler catch faults in the routines above (once per process; later calls do
/// nothing). Called before the first application memory is registered.
pub(crate) fn install() {
    arch::install();
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod arch {
    use std::{ffi::c_void, sync::OnceLock};

    // Each routine is a leaf that touches the stack only with its `ret`, so the landing pad's
    // `ret` returns to the routine's caller from any of their instructions. `cld` undoes the
    // backward copy's direction flag (the kernel clears it for the handler, and restores the
    // interrupted value on its return).
    std::arch::global_asm!(
        ".pushsection .text.rdma_emu_guarded,\"ax\",@progbits",
        ".p2align 4",
        ".globl rdma_emu_guarded_start",
        ".hidden rdma_emu_guarded_start",
        "rdma_emu_guarded_start:",
        // copy(dst: rdi, src: rsi, len: rdx) -> eax
        ".globl rdma_emu_guarded_copy",
        ".hidden rdma_emu_guarded_copy",
        "rdma_emu_guarded_copy:",
        // Up to 16 bytes (most work requests' payloads: a WRITE's word, a small SEND): the
        // first and the last bytes of a width, all loaded before any is stored (so the
        // ranges may overlap), without the loops below.
        "cmp rdx, 16",
        "ja 10f",
        "cmp rdx, 8",
        "jb 8f",
        "mov rax, qword ptr [rsi]",
        "mov rcx, qword ptr [rsi + rdx - 8]",
        "mov qword ptr [rdi], rax",
        "mov qword ptr [rdi + rdx - 8], rcx",
        "xor eax, eax",
        "ret",
        "8:",
        "cmp rdx, 4",
        "jb 9f",
        "mov eax, dword ptr [rsi]",
        "mov ecx, dword ptr [rsi + rdx - 4]",
        "mov dword ptr [rdi], eax",
        "mov dword ptr [rdi + rdx - 4], ecx",
        "xor eax, eax",
        "ret",
        // 1 to 3 bytes: the first, the middle and the last (some the same).
        "9:",
        "test rdx, rdx",
        "jz 6f",
        "mov r8, rdx",
        "shr r8, 1",
        "movzx eax, byte ptr [rsi]",
        "movzx ecx, byte ptr [rsi + r8]",
        "movzx r9d, byte ptr [rsi + rdx - 1]",
        "mov byte ptr [rdi], al",
        "mov byte ptr [rdi + r8], cl",
        "mov byte ptr [rdi + rdx - 1], r9b",
        "xor eax, eax",
        "ret",
        "10:",
        "mov rcx, rdx",
        "mov rax, rdi",
        "sub rax, rsi",
        // dst - src < len (unsigned): dst starts inside src; copy from the end.
        "cmp rax, rdx",
        "jb 5f",
        // Forward. Short copies (most work requests) in words: `rep movsb` takes tens of
        // cycles to start.
        "cmp rdx, 64",
        "jae 2f",
        "shr rcx, 3",
        "jz 4f",
        "3:",
        "mov rax, qword ptr [rsi]",
        "mov qword ptr [rdi], rax",
        "add rsi, 8",
        "add rdi, 8",
        "dec rcx",
        "jnz 3b",
        "4:",
        "and edx, 7",
        "jz 6f",
        "7:",
        "mov al, byte ptr [rsi]",
        "mov byte ptr [rdi], al",
        "inc rsi",
        "inc rdi",
        "dec edx",
        "jnz 7b",
        "6:",
        "xor eax, eax",
        "ret",
        "5:",
        "lea rsi, [rsi + rdx - 1]",
        "lea rdi, [rdi + rdx - 1]",
        "std",
        "rep movsb",
        "cld",
        "xor eax, eax",
        "ret",
        "2:",
        "rep movsb",
        "xor eax, eax",
        "ret",
        // fetch_add(p: rdi, add: rsi, old: rdx) -> eax
        ".globl rdma_emu_guarded_fetch_add",
        ".hidden rdma_emu_guarded_fetch_add",
        "rdma_emu_guarded_fetch_add:",
        "lock xadd qword ptr [rdi], rsi",
        "mov qword ptr [rdx], rsi",
        "xor eax, eax",
        "ret",
        // compare_swap(p: rdi, compare: rsi, swap: rdx, old: rcx) -> eax
        ".globl rdma_emu_guarded_compare_swap",
        ".hidden rdma_emu_guarded_compare_swap",
        "rdma_emu_guarded_compare_swap:",
        "mov rax, rsi",
        "lock cmpxchg qword ptr [rdi], rdx",
        "mov qword ptr [rcx], rax",
        "xor eax, eax",
        "ret",
        // store(p: rdi, word: rsi) -> eax (xchg: a sequentially consistent store)
        ".globl rdma_emu_guarded_store",
        ".hidden rdma_emu_guarded_store",
        "rdma_emu_guarded_store:",
        "xchg qword ptr [rdi], rsi",
        "xor eax, eax",
        "ret",
        // any_set(src: rdi, len: rsi, a multiple of 32) -> eax: 0 if all zeros, 2 if not
        ".globl rdma_emu_guarded_any_set",
        ".hidden rdma_emu_guarded_any_set",
        "rdma_emu_guarded_any_set:",
        "xor eax, eax",
        "test rsi, rsi",
        "jz 22f",
        "21:",
        "mov rcx, qword ptr [rdi]",
        "or rcx, qword ptr [rdi + 8]",
        "or rcx, qword ptr [rdi + 16]",
        "or rcx, qword ptr [rdi + 24]",
        "jnz 23f",
        "add rdi, 32",
        "sub rsi, 32",
        "jnz 21b",
        "22:",
        "ret",
        "23:",
        "mov eax, 2",
        "ret",
        ".globl rdma_emu_guarded_end",
        ".hidden rdma_emu_guarded_end",
        "rdma_emu_guarded_end:",
        // Where the handler resumes a faulted routine: it returns 1.
        ".globl rdma_emu_guarded_landing",
        ".hidden rdma_emu_guarded_landing",
        "rdma_emu_guarded_landing:",
        "cld",
        "mov eax, 1",
        "ret",
        ".popsection",
    );

    unsafe extern "C" {
        #[link_name = "rdma_emu_guarded_copy"]
        pub(super) fn copy(dst: *mut u8, src: *const u8, len: usize) -> u32;
        #[link_name = "rdma_emu_guarded_fetch_add"]
        pub(super) fn fetch_add(p: *mut u64, add: u64, old: *mut u64) -> u32;
        #[link_name = "rdma_emu_guarded_compare_swap"]
        pub(super) fn compare_swap(p: *mut u64, compare: u64, swap: u64, old: *mut u64) -> u32;
        #[link_name = "rdma_emu_guarded_store"]
        pub(super) fn store(p: *mut u64, word: u64) -> u32;
        #[link_name = "rdma_emu_guarded_any_set"]
        pub(super) fn any_set(src: *const u8, len: usize) -> u32;
        fn rdma_emu_guarded_start();
        fn rdma_emu_guarded_end();
        fn rdma_emu_guarded_landing();
    }

    /// The actions for SIGSEGV and SIGBUS before ours, to pass other faults on to.
    static PREVIOUS: OnceLock<[libc::sigaction; 2]> = OnceLock::new();

    pub(super) fn install() {
        PREVIOUS.get_or_init(|| {
            let mut previous = [empty(), empty()];
            for (sig, old) in [libc::SIGSEGV, libc::SIGBUS].into_iter().zip(&mut previous) {
                let mut act = empty();
                act.sa_sigaction = on_fault as *const () as usize;
                act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
                // SAFETY: valid sigaction structs; the handler is async-signal-safe (it reads
                // statics set before it is installed and edits the interrupted context).
                unsafe {
                    libc::sigemptyset(&mut act.sa_mask);
                    libc::sigaction(sig, &act, old);
                }
            }
            previous
        });
    }

    fn empty() -> libc::sigaction {
        // SAFETY: all-zero is a valid sigaction (SIG_DFL, no flags, empty mask).
        unsafe { std::mem::zeroed() }
    }

    extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
        let uc = ctx.cast::<libc::ucontext_t>();
        // SAFETY: the kernel passes the interrupted context and the fault's siginfo.
        let (rip, by_kernel) = unsafe {
            ((*uc).uc_mcontext.gregs[libc::REG_RIP as usize] as usize, (*info).si_code > 0)
        };
        let ours = rdma_emu_guarded_start as *const () as usize
            ..rdma_emu_guarded_end as *const () as usize;
        if by_kernel && ours.contains(&rip) {
            // SAFETY: resuming at the landing pad, which returns from the interrupted leaf.
            unsafe {
                (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] =
                    rdma_emu_guarded_landing as *const () as usize as i64;
            }
            return;
        }
        let previous = PREVIOUS.get().map(|p| p[usize::from(sig == libc::SIGBUS)]);
        match previous {
            Some(old) if old.sa_flags & libc::SA_SIGINFO != 0 => {
                // SAFETY: the previous handler, installed with SA_SIGINFO, takes these.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                    unsafe { std::mem::transmute(old.sa_sigaction) };
                f(sig, info, ctx);
            }
            Some(old) if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN => {
                // SAFETY: a plain handler, installed without SA_SIGINFO.
                let f: extern "C" fn(libc::c_int) =
                    unsafe { std::mem::transmute(old.sa_sigaction) };
                f(sig);
            }
            _ => {
                // The default action: once back, the fault repeats and ends the process as
                // it would have without us (with a core dump where those are on).
                let act = empty();
                // SAFETY: a valid sigaction (SIG_DFL).
                unsafe { libc::sigaction(sig, &act, std::ptr::null_mut()) };
            }
        }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod arch {
    //! Elsewhere the accesses are plain: a fault ends the process.
    use std::sync::atomic::{AtomicU64, Ordering};

    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> u32 {
        // SAFETY: the caller's ranges, valid (no recovery here).
        unsafe { std::ptr::copy(src, dst, len) };
        0
    }

    pub(super) unsafe fn fetch_add(p: *mut u64, add: u64, old: *mut u64) -> u32 {
        // SAFETY: aligned, valid (the caller's promise).
        unsafe { *old = AtomicU64::from_ptr(p).fetch_add(add, Ordering::SeqCst) };
        0
    }

    pub(super) unsafe fn compare_swap(p: *mut u64, compare: u64, swap: u64, old: *mut u64) -> u32 {
        // SAFETY: as above.
        let a = unsafe { AtomicU64::from_ptr(p) };
        let v = match a.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(v) | Err(v) => v,
        };
        // SAFETY: `old` is the caller's.
        unsafe { *old = v };
        0
    }

    pub(super) unsafe fn store(p: *mut u64, word: u64) -> u32 {
        // SAFETY: as above.
        unsafe { AtomicU64::from_ptr(p).store(word, Ordering::SeqCst) };
        0
    }

    pub(super) unsafe fn any_set(src: *const u8, len: usize) -> u32 {
        // SAFETY: the caller's range, valid (no recovery here).
        let bytes = unsafe { std::slice::from_raw_parts(src, len) };
        if bytes.iter().any(|&b| b != 0) { 2 } else { 0 }
    }

    pub(super) fn install() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page mapped read-only and, right after it, one no access reaches (as an unmapped
    /// page faults; a hole left by munmap could be refilled by another test's mapping).
    fn pages() -> (*mut u8, *mut u8) {
        // SAFETY: a fresh anonymous mapping of two pages, the first made readable.
        unsafe {
            let ro = libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(ro, libc::MAP_FAILED);
            assert_eq!(libc::mprotect(ro, 4096, libc::PROT_READ), 0);
            (ro.cast::<u8>().add(4096), ro.cast())
        }
    }

    #[test]
    fn copies_and_atomics_work_on_memory_that_is_there() {
        install();
        let mut a = *b"0123456789abcdef";
        let b = [7u8; 16];
        // SAFETY: two live arrays.
        assert!(unsafe { copy(b.as_ptr(), a.as_mut_ptr(), 16) });
        assert_eq!(a, [7u8; 16]);
        // Overlapping both ways, as memmove.
        let mut s = *b"abcdefgh";
        // SAFETY: within `s`.
        assert!(unsafe { copy(s.as_ptr(), s.as_mut_ptr().add(2), 6) });
        assert_eq!(&s, b"ababcdef");
        let mut s = *b"abcdefgh";
        // SAFETY: within `s`.
        assert!(unsafe { copy(s.as_ptr().add(2), s.as_mut_ptr(), 6) });
        assert_eq!(&s, b"cdefghgh");
        // Every length either side of the word loop's and rep movsb's, at every alignment,
        // forward and overlapping both ways, against memmove.
        let pattern: Vec<u8> = (0..200u8).collect();
        for len in 0..80 {
            for (from, to) in [(0, 100), (3, 101), (10, 13), (13, 10), (5, 5 + len / 2)] {
                let (mut ours, mut std) = (pattern.clone(), pattern.clone());
                // SAFETY: both ranges inside the 200-byte vectors.
                unsafe {
                    assert!(copy(ours.as_ptr().add(from), ours.as_mut_ptr().add(to), len));
                    std::ptr::copy(std.as_ptr().add(from), std.as_mut_ptr().add(to), len);
                }
                assert_eq!(ours, std, "len {len}, {from} -> {to}");
            }
        }
        let mut w = 40u64;
        // SAFETY: an aligned local word.
        unsafe {
            assert_eq!(fetch_add(&mut w, 2), Some(40));
            assert_eq!(compare_swap(&mut w, 1, 5), Some(42));
            assert_eq!(compare_swap(&mut w, 42, 5), Some(42));
            assert!(store(&mut w, 9));
        }
        assert_eq!(w, 9);
        // A byte set anywhere in the range, at either end of a word, is found; none past it.
        let mut page = [0u8; 4096];
        // SAFETY: a live array; every length a multiple of 32 inside it.
        unsafe {
            assert_eq!(any_set(page.as_ptr(), 0), Some(false));
            assert_eq!(any_set(page.as_ptr(), 4096), Some(false));
            for at in [0, 7, 8, 31, 32, 2047, 4064, 4095] {
                page[at] = 1;
                assert_eq!(any_set(page.as_ptr(), 4096), Some(true), "byte {at}");
                assert_eq!(any_set(page.as_ptr(), at / 32 * 32), Some(false), "before {at}");
                page[at] = 0;
            }
        }
    }

    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn a_fault_fails_the_access_instead_of_the_process() {
        install();
        let (gone, ro) = pages();
        let mut local = [1u8; 64];
        // SAFETY: the point: the handler recovers each fault.
        unsafe {
            assert!(!copy(gone, local.as_mut_ptr(), 64), "read of unmapped memory");
            assert!(!copy(gone, local.as_mut_ptr(), 8), "a word's read");
            assert!(!copy(local.as_ptr(), gone.add(3), 13), "a short write");
            assert!(!copy(local.as_ptr(), ro.add(4096 - 4), 8), "a word across into the hole");
            // The short copies' every width, faulting on their first or only their last
            // access, and right up to the end of a mapping without a fault.
            for len in 1..=16 {
                assert!(!copy(gone, local.as_mut_ptr(), len), "read of {len}");
                assert!(!copy(local.as_ptr(), gone, len), "write of {len}");
                assert!(!copy(local.as_ptr(), ro, len), "write of {len} to read-only memory");
                if len > 1 {
                    let across = ro.add(4096 - len + 1);
                    assert!(!copy(across, local.as_mut_ptr(), len), "read of {len} across");
                }
                let mut end = [9u8; 16];
                assert!(copy(ro.add(4096 - len), end.as_mut_ptr(), len), "{len} up to the end");
                assert_eq!(&end[..len], &vec![0u8; len][..]);
            }
            assert!(!copy(local.as_ptr(), gone, 64), "write to unmapped memory");
            assert!(!copy(local.as_ptr(), ro, 64), "write to read-only memory");
            assert!(copy(ro, local.as_mut_ptr(), 64), "read of read-only memory");
            assert_eq!(local, [0u8; 64]);
            // A copy that runs off the end of a mapping into the hole after it.
            assert!(!copy(local.as_ptr(), ro.add(4096 - 16), 64));
            assert_eq!(fetch_add(gone.cast(), 1), None);
            assert_eq!(compare_swap(ro.cast(), 0, 1), None);
            assert!(!store(gone.cast(), 1));
            assert_eq!(any_set(gone, 64), None, "a look at unmapped memory");
            assert_eq!(any_set(ro.add(4096 - 32), 64), None, "a look across into the hole");
            assert_eq!(any_set(ro, 4096), Some(false), "read-only memory is looked at");
            // Still fine after recovering.
            let mut w = 1u64;
            assert_eq!(fetch_add(&mut w, 1), Some(1));
            libc::munmap(ro.cast(), 8192);
        }
    }

    /// A fault outside the guarded routines still ends the process (in a child): by SIGSEGV,
    /// or under AddressSanitizer (whose handler came first) by its report and exit status.
    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn other_faults_still_end_the_process() {
        install();
        let (gone, _) = pages();
        // SAFETY: the child only faults; the parent waits for it.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                std::ptr::write_volatile(gone, 1);
                libc::_exit(0);
            }
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
            let asan_exit = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) != 0;
            assert!(
                asan_exit || libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV,
                "status {status:#x}"
            );
        }
    }
}
