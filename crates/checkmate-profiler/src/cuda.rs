//! CUDA timing and memory on candle's stream (the `cuda` feature).
//!
//! - Time: CUDA events (`cuEventRecord` with timing enabled) recorded on the stream candle
//!   launches its kernels on ([`candle_core::cuda_backend::CudaDevice::cuda_stream`]), read with
//!   `cuEventElapsedTime`. The executor's `run_plan` exposes no per-step hook, so events bracket
//!   whole steps; per node, the executor's `step_seconds` (device synchronize after each step,
//!   host monotonic clock) is used.
//! - Memory: when the context allocates stream-ordered (`cuMemAllocAsync`, which cudarc uses when
//!   the device supports memory pools), the default pool's `CU_MEMPOOL_ATTR_USED_MEM_HIGH` is reset
//!   before a step and read after it: the device-memory high-water mark of the step, static
//!   memory (parameters, batch) included. The pool's counters are the executor's
//!   ([`checkmate_executor::meter::cuda_pool`]), which `checkmate train` enforces its budget with.
//!
//! Only cudarc's driver API, as re-exported by candle (`candle_core::cuda_backend::cudarc`), is
//! used, so the build links the CUDA libraries exactly as candle does.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{sys, CudaEvent, CudaStream, DriverError};
use candle_core::Device;
use checkmate_executor::meter::cuda_pool::Pool;

use crate::error::{Error, Result};

fn cuda_err(what: &str) -> impl FnOnce(DriverError) -> Error + '_ {
    move |e| Error::Cuda(format!("{what}: {e:?}"))
}

/// `cuda:<ordinal> (<GPU name>)` for a CUDA device, `cuda` when the name cannot be read.
pub fn device_label(device: &Device) -> String {
    match device {
        Device::Cuda(d) => {
            let stream = d.cuda_stream();
            let ctx = stream.context();
            match ctx.name() {
                Ok(name) => format!("cuda:{} ({name})", ctx.ordinal()),
                Err(_) => format!("cuda:{}", ctx.ordinal()),
            }
        }
        other => format!("{:?}", other.location()),
    }
}

/// Times and sizes whole steps on a CUDA device.
#[derive(Debug)]
pub struct Probe {
    stream: Arc<CudaStream>,
    pool: Option<Pool>,
}

/// A step being measured: the start event (see [`Probe::start`]).
#[derive(Debug)]
pub struct Mark {
    start: CudaEvent,
}

fn pool_err(e: checkmate_executor::Error) -> Error {
    Error::Cuda(e.to_string())
}

impl Probe {
    /// A probe on candle's stream of `device`; `None` when the device is not CUDA.
    pub fn new(device: &Device) -> Result<Option<Probe>> {
        let Device::Cuda(d) = device else {
            return Ok(None);
        };
        let stream = d.cuda_stream();
        let pool = Pool::of(d).map_err(pool_err)?;
        Ok(Some(Probe { stream, pool }))
    }

    /// The pool's used-memory high-water mark since the last reset, if the context allocates
    /// from a memory pool.
    pub fn used_high(&self) -> Result<Option<u64>> {
        self.pool
            .as_ref()
            .map(|p| p.peak().map_err(pool_err))
            .transpose()
    }

    /// Resets the pool's high-water mark to the memory in use now.
    pub fn reset_high(&self) -> Result<()> {
        match &self.pool {
            Some(p) => p.reset_peak().map_err(pool_err),
            None => Ok(()),
        }
    }

    /// Synchronizes the stream, resets the high-water mark and records a start event.
    pub fn start(&self) -> Result<Mark> {
        self.stream
            .synchronize()
            .map_err(cuda_err("synchronizing"))?;
        self.reset_high()?;
        let start = self
            .stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda_err("recording the start event"))?;
        Ok(Mark { start })
    }

    /// Records the end event; returns the seconds between the events and the high-water mark
    /// since [`Probe::start`] (bytes), if known.
    pub fn stop(&self, mark: Mark) -> Result<(f64, Option<u64>)> {
        let end = self
            .stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda_err("recording the end event"))?;
        let ms = mark
            .start
            .elapsed_ms(&end)
            .map_err(cuda_err("reading the elapsed time"))?;
        Ok((f64::from(ms) / 1e3, self.used_high()?))
    }
}
