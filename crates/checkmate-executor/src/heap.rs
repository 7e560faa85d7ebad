//! A counting global allocator: the process heap in use and its high-water mark.
//!
//! Install it in a binary or test (`#[global_allocator] static A: Counting = Counting;`) and
//! [`Executor::run_plan`](crate::Executor::run_plan) measures the heap during every step of a
//! plan (`StepReport::heap_during_step`) and enforces [`HeapLimit`](crate::HeapLimit) when one is
//! set. Without it the heap is not measured. `checkmate train` and `max-batch` install it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The system allocator, counting live bytes.
pub struct Counting;

static CURRENT: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

fn grew(bytes: u64) {
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
    let now = CURRENT.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

fn shrank(bytes: u64) {
    CURRENT.fetch_sub(bytes, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged; only counters are updated.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            grew(layout.size() as u64);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            grew(layout.size() as u64);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        shrank(layout.size() as u64);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            shrank(layout.size() as u64);
            grew(new_size as u64);
        }
        p
    }
}

/// Heap bytes in use now.
pub fn current() -> u64 {
    CURRENT.load(Ordering::Relaxed)
}

/// Highest heap bytes in use since the last [`reset_peak`].
pub fn peak() -> u64 {
    PEAK.load(Ordering::Relaxed)
}

/// Starts a new high-water mark from the bytes in use now.
pub fn reset_peak() {
    PEAK.store(current(), Ordering::Relaxed);
}

/// Raises the high-water mark to at least `bytes` (to restore an outer measurement after an
/// inner one reset it).
pub fn raise_peak(bytes: u64) {
    PEAK.fetch_max(bytes, Ordering::Relaxed);
}

/// Whether [`Counting`] is the global allocator (it has counted an allocation).
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// Heap bytes that no node models and that a hard cap must leave room for: gemm's packing
/// buffers (per thread, grown to the largest product the process has run) and candle's tensor
/// metadata and the executor's bookkeeping. On the zoo: up to 0.8 MiB held from the step's start
/// and up to 0.75 MiB more inside a node (`tests/heap.rs` allows 1 MiB per node), 1.55 MiB in all
/// at worst (ResNet50's first convolution's backward). `checkmate train` (with the budget
/// enforced) and `max-batch` leave this much of the budget out of the plan.
pub const RESERVE_BYTES: u64 = 2 << 20;

/// Allocates, once per thread, what the CPU matrix products keep for the process's life: `gemm`
/// caches a packing buffer (about the L2 cache's size) in a thread-local on every thread that
/// runs a product, the first time it does (2 MiB per thread on this project's machines). Call it
/// on the CPU before taking a heap baseline, so that these buffers are part of the baseline and
/// not counted, on the first training step, as memory the step's nodes took. Runs one small
/// product on the calling thread and on every rayon worker.
pub fn warm_up_cpu() -> crate::Result<()> {
    use candle_core::{DType, Device, Tensor};
    let product = || -> candle_core::Result<()> {
        let a = Tensor::ones((64, 64), DType::F32, &Device::Cpu)?;
        a.matmul(&a).map(drop)
    };
    use crate::error::TensorContext;
    let ctx = || "warming up the CPU matrix products".to_string();
    product().ctx(ctx)?;
    rayon::broadcast(|_| product())
        .into_iter()
        .collect::<candle_core::Result<Vec<()>>>()
        .ctx(ctx)?;
    Ok(())
}
