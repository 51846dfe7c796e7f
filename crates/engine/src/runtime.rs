//! Process-wide settings that must be made before any other thread starts: the command line
//! calls [`prepare`] first thing, and the stages that train call [`use_one_candle_thread`]. Each
//! removes work that the small tensors of training (and, less, every other candle op) pay on
//! each op.

/// Applies every setting of this module.
pub fn prepare() {
    name_the_thread_count();
    keep_freed_memory();
}

/// candle asks for its thread count on every matrix product, and when `RAYON_NUM_THREADS` is
/// unset it counts the physical cores by reading and parsing `/proc/cpuinfo`, each time, which
/// is a visible share of the CPU time of AF's many small products. Naming the count rayon would choose
/// anyway (the logical CPUs this process may use) makes the lookup an environment read. On a
/// machine with SMT, candle's matrix products then split over logical rather than physical
/// cores, as rayon's own work always did.
fn name_the_thread_count() {
    if std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return;
    }
    if let Ok(n) = std::thread::available_parallelism() {
        // Only the main thread runs yet, so no other thread reads the environment meanwhile.
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
}

/// Runs candle's elementwise CPU ops on the calling thread unless `CANDLE_NUM_THREADS` is set
/// (its matrix products still spread over the cores). Training tensors are small (AF's
/// ensemble: a few hundred rows by tens of channels; the cross-encoder: a batch's tokens by 384),
/// and candle hands every elementwise op above a few thousand elements to a worker pool that
/// spin-waits between ops and serves one caller at a time: on two cores the hand-offs cost more
/// than the arithmetic, several times more when other processes compete for the cores.
/// Training uses the cores by running each batch as halves on rayon's threads instead. Results
/// do not depend on the thread count. Call it from the command line's main thread before any
/// candle op, since candle sizes its pool once, on first use.
pub fn use_one_candle_thread() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}

/// glibc's malloc serves blocks above a threshold that starts at 128 KiB straight from `mmap`
/// and hands freed memory at the top of a heap back to the kernel, so the per-op tensors of AF
/// training (0.1 to a few MB each, thousands a second) would be page-faulted in and zeroed by
/// the kernel anew on every op. Blocks up to 32 MiB (glibc's largest threshold) come from the
/// heap instead, and up to 128 MiB of freed heap is kept for reuse; larger blocks (a scoring
/// batch's logits) still go back when freed.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 20);
    }
}
