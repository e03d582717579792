//! The `metahook` binary: parses the command line and hands over to [`metahook::tools::cli`].

/// mimalloc instead of glibc's malloc: `perf` at idle with 3,000 parents resynced every 10 s put a
/// third of the hub's CPU in glibc's allocator (`_int_malloc`, `malloc_consolidate`, `free`), for the
/// many short-lived allocations of decoding cached objects and building hook requests. Set here, in
/// the binary, so the library leaves the choice to whoever embeds it.
///
/// Wrapped in the heap sampler, which records nothing (and costs one relaxed load per call) unless
/// profiles are served (`pprofAddress`, Metacontroller's `--pprof-address`).
#[global_allocator]
static ALLOCATOR: metahook::ops::heap::Sampled<mimalloc::MiMalloc> = metahook::ops::heap::Sampled(mimalloc::MiMalloc);

fn main() -> std::process::ExitCode {
    metahook::tools::cli::main()
}
