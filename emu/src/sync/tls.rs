//! Thread-local words that a shared library reaches without `__tls_get_addr`.
//!
//! A `thread_local!` in a shared library (the C shim, `libibverbs.so.1`) is reached through a
//! call to `__tls_get_addr`: ~11 instructions and the call's register moves at every access.
//! A word declared by [`tls_word!`] is a TLS variable of the crate's own, reached through a TLS
//! descriptor (`-mtls-dialect=gnu2`'s model): for a library loaded with the program the
//! descriptor's function returns the word's offset from the thread pointer in two instructions
//! (`_dl_tlsdesc_return`); for one loaded later by `dlopen` (UCX's and Open MPI's components
//! load `libibverbs.so.1` so) it still works, where the initial-exec model would ask the
//! loader for room in the static TLS block, which a `dlopen` can exhaust. In a program, the
//! linker replaces the call with the offset itself. A word is zero when its thread starts
//! (the TLS block's `.tbss`), has no destructor, and is global but hidden: the crate's code
//! units reach it, nothing outside. Elsewhere than x86-64 Linux it is a `thread_local!`.

/// The calling thread's thread pointer: the address of its control block, which the TLS ABI's
/// offsets are from (unique among running threads). One load, where a thread-local in a shared
/// library (the C shim) costs a call to `__tls_get_addr`.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
pub(crate) fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: on x86-64 Linux the C library points `fs` at the thread's control block, whose
    // first word is its own address (the TLS ABI's thread pointer).
    unsafe {
        std::arch::asm!(
            "mov {}, qword ptr fs:[0]",
            out(reg) tp,
            options(nostack, preserves_flags, readonly, pure),
        );
    }
    tp
}

/// Declares `mod $name` with `with`, `get`, `set` and `replace` on the calling thread's own
/// `u64` word, zero at the thread's start; `$sym` is the word's symbol, unique in the crate.
macro_rules! tls_word {
    ($(#[$doc:meta])* $vis:vis mod $name:ident = $sym:literal;) => {
        $(#[$doc])*
        #[allow(unsafe_code)]
        $vis mod $name {
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            std::arch::global_asm!(
                ".pushsection .tbss,\"awT\",@nobits",
                ".p2align 3",
                concat!(".globl ", $sym),
                concat!(".hidden ", $sym),
                concat!(".type ", $sym, ", @tls_object"),
                concat!(".size ", $sym, ", 8"),
                concat!($sym, ":"),
                ".zero 8",
                ".popsection",
            );

            /// The word's offset from the thread pointer (`fs`), for the calling thread.
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            #[inline(always)]
            fn offset() -> usize {
                let off: usize;
                // SAFETY: the symbol is the 8-byte, 8-aligned TLS word defined above. Its
                // descriptor's function (the loader's) returns in `rax` the word's offset from
                // the thread pointer for the calling thread, and by the descriptor ABI changes
                // no other register (the flags aside; the vector registers are declared changed
                // all the same, below). Not `nostack`: the call pushes its return address, and
                // the slow way uses the stack below the pointer. Pure: a thread's offset never
                // changes.
                unsafe {
                    std::arch::asm!(
                        concat!("lea rax, [rip + ", $sym, "@TLSDESC]"),
                        concat!("call qword ptr [rax + ", $sym, "@TLSCALL]"),
                        out("rax") off,
                        // The descriptor's slow way (a library loaded by `dlopen`, a thread's
                        // first use) calls into the C library, which may change the vector
                        // registers; Debian 12's glibc (2.36) does not keep them there.
                        out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                        out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
                        out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
                        out("xmm12") _, out("xmm13") _, out("xmm14") _, out("xmm15") _,
                        options(pure, readonly),
                    );
                }
                off
            }

            /// Runs `f` on the calling thread's word (its place found once, however often
            /// `f` reads and writes it).
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            #[inline(always)]
            #[allow(dead_code)]
            pub(crate) fn with<R>(f: impl FnOnce(&std::cell::Cell<u64>) -> R) -> R {
                let tp = $crate::sync::tls::thread_pointer();
                let word = tp.wrapping_add(offset()) as *const std::cell::Cell<u64>;
                // SAFETY: the calling thread's word, 8-aligned in its TLS block, which lives
                // as long as the thread; only this thread reaches it, and the reference does
                // not leave `f` (a `Cell` is neither `Sync` nor shared with other threads).
                f(unsafe { &*word })
            }

            #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
            thread_local! {
                static WORD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
            }

            /// Runs `f` on the calling thread's word.
            #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
            #[inline(always)]
            #[allow(dead_code)]
            pub(crate) fn with<R>(f: impl FnOnce(&std::cell::Cell<u64>) -> R) -> R {
                WORD.with(f)
            }

            /// The calling thread's word (one load at its offset from `fs`).
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            #[inline(always)]
            #[allow(dead_code)]
            pub(crate) fn get() -> u64 {
                let word: u64;
                // SAFETY: `offset` is the calling thread's word, in its TLS block, which lives
                // as long as the thread.
                unsafe {
                    std::arch::asm!(
                        "mov {word}, qword ptr fs:[{off}]",
                        off = in(reg) offset(),
                        word = out(reg) word,
                        options(nostack, preserves_flags, readonly),
                    );
                }
                word
            }

            /// Sets the calling thread's word (one store at its offset from `fs`).
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            #[inline(always)]
            #[allow(dead_code)]
            pub(crate) fn set(word: u64) {
                // SAFETY: as in `get`; only this thread reaches its own block's word.
                unsafe {
                    std::arch::asm!(
                        "mov qword ptr fs:[{off}], {word}",
                        off = in(reg) offset(),
                        word = in(reg) word,
                        options(nostack, preserves_flags),
                    );
                }
            }

            /// The calling thread's word.
            #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
            #[inline(always)]
            #[allow(dead_code)]
            pub(crate) fn get() -> u64 {
                with(std::cell::Cell::get)
            }

            /// Sets the calling thread's word.
            #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
            #[inline(always)]
            #[allow(dead_code)]
            pub(crate) fn set(word: u64) {
                with(|w| w.set(word));
            }

            /// Sets the calling thread's word; what it held.
            #[inline(always)]
            #[allow(dead_code)]
            pub(crate) fn replace(word: u64) -> u64 {
                with(|w| w.replace(word))
            }
        }
    };
}
pub(crate) use tls_word;

#[cfg(test)]
mod test {
    tls_word! {
        mod probe = "rdma_emu_sync_tls_test_probe";
    }

    #[test]
    fn test_each_thread_has_its_own_word_zero_at_its_start() {
        probe::set(7);
        let other = std::thread::spawn(|| {
            let first = probe::get();
            probe::set(9);
            (first, probe::get())
        })
        .join()
        .unwrap();
        assert_eq!(other, (0, 9));
        assert_eq!(probe::get(), 7);
        assert_eq!(probe::replace(3), 7);
        probe::with(|w| w.set(w.get() * 5));
        assert_eq!(probe::get(), 15);
    }
}
