//! How a packed product's work is shared out between threads: chunks of weight panels that
//! stay in a core's cache, groups of activation rows, and the output they write apart.

/// Columns of one panel: two 16-lane registers, or four 8-lane ones.
pub(super) const NR: usize = 32;
/// Weight bytes a thread's chunk of panels may take, so the chunk stays in its core's L2 cache
/// while every row block passes over it.
const CHUNK_BYTES: usize = 256 * 1024;

/// How a product's work is shared out: panels per chunk (as many as keep a thread's chunk of
/// weights in its core's L2 cache while every row block passes over it) and row blocks per
/// group. A narrow matrix has few chunks (a 384-column one has 3), too few to share out evenly
/// between the threads: then the row blocks are split into groups as well, each task one group
/// × chunk. Every group streams the chunk's weights again, so only then.
pub(super) fn plan_tasks(n_panels: usize, panel_bytes: usize, n_blocks: usize) -> (usize, usize) {
    let per_chunk = (CHUNK_BYTES / panel_bytes.max(1)).clamp(1, n_panels.max(1));
    let n_chunks = n_panels.div_ceil(per_chunk);
    let wanted_tasks = 2 * rayon::current_num_threads();
    let per_group = n_blocks
        .div_ceil(wanted_tasks.div_ceil(n_chunks.max(1)))
        .max(1);
    (per_chunk, per_group)
}

/// The output pointer, shared by tasks that write disjoint blocks of it.
#[derive(Clone, Copy)]
pub(super) struct OutPtr(pub(super) *mut f32);

impl OutPtr {
    /// # Safety
    /// `offset` must lie inside the output.
    pub(super) unsafe fn at(self, offset: usize) -> *mut f32 {
        self.0.add(offset)
    }
}
// SAFETY: tasks write disjoint elements (see the products' `apply`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}
