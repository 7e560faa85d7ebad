//! Where a training step's memory is measured: the process heap on the CPU, the CUDA memory pool
//! on a GPU.
//!
//! [`Meter`] gives both the same four operations (bytes in use, high-water mark, reset, raise),
//! so that [`Executor::run_plan`](crate::Executor::run_plan), its hard cap
//! ([`HeapLimit`](crate::HeapLimit)) and `checkmate train` measure and enforce a budget the same
//! way on either device:
//!
//! - CPU: the counting global allocator ([`heap`]), when a binary or test installed it.
//! - CUDA (the `cuda` feature): the device's default memory pool, from which cudarc allocates
//!   stream-ordered (`cuMemAllocAsync`) when the device supports pools; its
//!   `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` is the memory in use and `CU_MEMPOOL_ATTR_USED_MEM_HIGH`
//!   the high-water mark since its last reset (the driver accepts only 0, which resets it to the
//!   memory in use). Read after the stream is synchronized, so that every kernel of the step has
//!   run and every stream-ordered free has happened.
//!
//! The driver's high-water mark cannot be raised, so [`Meter::raise_peak`] (which restores an
//! outer measurement after an inner one reset the mark) keeps the raised value beside it, as the
//! heap does.

use candle_core::Device;

use crate::heap;
use crate::Result;

/// Measures the memory of one device. Cheap to clone.
#[derive(Debug, Clone)]
pub enum Meter {
    /// Nothing measures this device's memory: a CPU without [`heap::Counting`] installed, or a
    /// CUDA context that does not allocate from a memory pool.
    Unmeasured,
    /// The process heap, through [`heap::Counting`].
    Heap,
    /// The CUDA device's default memory pool.
    #[cfg(feature = "cuda")]
    CudaPool(cuda_pool::Pool),
}

impl Meter {
    /// The meter for `device`: the heap on the CPU when the counting allocator is installed, the
    /// default memory pool on a CUDA device that allocates from one, else [`Meter::Unmeasured`].
    pub fn for_device(device: &Device) -> Result<Meter> {
        match device {
            Device::Cpu if heap::installed() => Ok(Meter::Heap),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => {
                Ok(cuda_pool::Pool::of(d)?.map_or(Meter::Unmeasured, Meter::CudaPool))
            }
            _ => Ok(Meter::Unmeasured),
        }
    }

    /// Whether this meter measures anything.
    pub fn measures(&self) -> bool {
        !matches!(self, Meter::Unmeasured)
    }

    /// What is measured, for messages: `process heap`, `CUDA memory pool` or `nothing`.
    pub fn describe(&self) -> &'static str {
        match self {
            Meter::Unmeasured => "nothing",
            Meter::Heap => "process heap",
            #[cfg(feature = "cuda")]
            Meter::CudaPool(_) => "CUDA memory pool",
        }
    }

    /// Bytes in use now (0 when unmeasured).
    pub fn current(&self) -> Result<u64> {
        match self {
            Meter::Unmeasured => Ok(0),
            Meter::Heap => Ok(heap::current()),
            #[cfg(feature = "cuda")]
            Meter::CudaPool(p) => p.current(),
        }
    }

    /// The high-water mark since the last [`Meter::reset_peak`] (0 when unmeasured).
    pub fn peak(&self) -> Result<u64> {
        match self {
            Meter::Unmeasured => Ok(0),
            Meter::Heap => Ok(heap::peak()),
            #[cfg(feature = "cuda")]
            Meter::CudaPool(p) => p.peak(),
        }
    }

    /// Starts a new high-water mark from the bytes in use now.
    pub fn reset_peak(&self) -> Result<()> {
        match self {
            Meter::Unmeasured => Ok(()),
            Meter::Heap => {
                heap::reset_peak();
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Meter::CudaPool(p) => p.reset_peak(),
        }
    }

    /// Raises the high-water mark to at least `bytes` (to restore an outer measurement after an
    /// inner one reset it).
    pub fn raise_peak(&self, bytes: u64) {
        match self {
            Meter::Unmeasured => {}
            Meter::Heap => heap::raise_peak(bytes),
            #[cfg(feature = "cuda")]
            Meter::CudaPool(_) => cuda_pool::raise_peak(bytes),
        }
    }
}

/// The CUDA default memory pool's counters (the `cuda` feature).
#[cfg(feature = "cuda")]
pub mod cuda_pool {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use candle_core::cuda_backend::cudarc::driver::{result, sys, CudaStream, DriverError};
    use candle_core::cuda_backend::CudaDevice;

    use crate::{Error, Result};

    /// What [`raise_peak`] raised the high-water mark to since the last reset (the driver's own
    /// mark cannot be raised). One per process, like the pool of device 0 it usually describes.
    static RAISED: AtomicU64 = AtomicU64::new(0);

    fn driver(what: &'static str) -> impl FnOnce(DriverError) -> Error {
        move |e| Error::Device(format!("CUDA memory pool: {what}: {e:?}"))
    }

    /// The default memory pool of candle's CUDA device.
    #[derive(Debug, Clone)]
    pub struct Pool {
        stream: Arc<CudaStream>,
    }

    impl Pool {
        /// The pool `device` allocates from; `None` when its context does not allocate
        /// stream-ordered (no memory pools on this device or driver).
        pub fn of(device: &CudaDevice) -> Result<Option<Pool>> {
            let stream = device.cuda_stream();
            if !stream.context().has_async_alloc() {
                return Ok(None);
            }
            let pool = Pool { stream };
            pool.handle()?;
            Ok(Some(pool))
        }

        fn handle(&self) -> Result<sys::CUmemoryPool> {
            let ctx = self.stream.context();
            ctx.bind_to_thread()
                .map_err(driver("binding the context"))?;
            // SAFETY: the device handle comes from a live context, bound to this thread.
            unsafe { result::device::get_default_mem_pool(ctx.cu_device()) }
                .map_err(driver("reading the default memory pool"))
        }

        fn attribute(&self, attr: sys::CUmemPool_attribute) -> Result<u64> {
            let pool = self.handle()?;
            let mut value: u64 = 0;
            // SAFETY: the pool is the device's default pool; both USED_MEM attributes are
            // cuuint64_t.
            unsafe {
                result::mem_pool::get_attribute(
                    pool,
                    attr,
                    &mut value as *mut u64 as *mut core::ffi::c_void,
                )
            }
            .map_err(driver("reading an attribute"))?;
            Ok(value)
        }

        /// Bytes allocated from the pool now (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`).
        pub fn current(&self) -> Result<u64> {
            self.attribute(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
        }

        /// The pool's high-water mark since the last reset, or what [`raise_peak`] raised it to.
        pub fn peak(&self) -> Result<u64> {
            let high = self.attribute(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?;
            Ok(high.max(RAISED.load(Ordering::Relaxed)))
        }

        /// Resets the high-water mark to the bytes in use now.
        pub fn reset_peak(&self) -> Result<()> {
            let pool = self.handle()?;
            let mut zero: u64 = 0;
            // SAFETY: as in `attribute`; the driver accepts only 0 for this attribute (a reset).
            unsafe {
                result::mem_pool::set_attribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                    &mut zero as *mut u64 as *mut core::ffi::c_void,
                )
            }
            .map_err(driver("resetting the high-water mark"))?;
            RAISED.store(0, Ordering::Relaxed);
            Ok(())
        }
    }

    /// Raises the pool's high-water mark, as [`Pool::peak`] reports it, to at least `bytes`.
    pub fn raise_peak(bytes: u64) {
        RAISED.fetch_max(bytes, Ordering::Relaxed);
    }
}
