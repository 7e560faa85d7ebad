//! Measuring the bytes tensors really hold: storages, each counted once.

use std::collections::HashSet;

use candle_core::{DType, Storage, Tensor};

/// The identity of a tensor's storage (equal for views of one buffer) and its size in bytes.
///
/// The size is the whole buffer's, not the view's: a small view of a big buffer reports the big
/// buffer, which is exactly what keeps the memory alive.
pub fn storage_of(t: &Tensor) -> candle_core::Result<(usize, u64)> {
    let (guard, _layout) = t.storage_and_layout();
    let storage: &Storage = &guard;
    let key = storage as *const Storage as usize;
    let elements = match storage {
        Storage::Cpu(cpu) => match storage.dtype() {
            DType::F32 => cpu.as_slice::<f32>()?.len(),
            DType::F64 => cpu.as_slice::<f64>()?.len(),
            DType::U32 => cpu.as_slice::<u32>()?.len(),
            DType::U8 => cpu.as_slice::<u8>()?.len(),
            DType::I64 => cpu.as_slice::<i64>()?.len(),
            other => candle_core::bail!("storage_of: unsupported dtype {other:?}"),
        },
        #[cfg(feature = "cuda")]
        Storage::Cuda(cuda) => match storage.dtype() {
            DType::F32 => cuda.as_cuda_slice::<f32>()?.len(),
            DType::F64 => cuda.as_cuda_slice::<f64>()?.len(),
            DType::U32 => cuda.as_cuda_slice::<u32>()?.len(),
            DType::U8 => cuda.as_cuda_slice::<u8>()?.len(),
            DType::I64 => cuda.as_cuda_slice::<i64>()?.len(),
            other => candle_core::bail!("storage_of: unsupported dtype {other:?}"),
        },
        #[allow(unreachable_patterns)]
        _ => candle_core::bail!("storage_of: unsupported device"),
    };
    Ok((key, (elements * storage.dtype().size_in_bytes()) as u64))
}

/// Sum of the storage bytes of `tensors`, a storage shared by several counted once.
pub fn live_bytes<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> candle_core::Result<u64> {
    let mut seen = HashSet::new();
    let mut total = 0;
    for t in tensors {
        let (key, bytes) = storage_of(t)?;
        if seen.insert(key) {
            total += bytes;
        }
    }
    Ok(total)
}

/// `t` itself when it owns a buffer of exactly its own size that no tensor in `taken` uses;
/// otherwise a fresh copy, so that keeping `t` keeps nothing else alive.
pub fn owned(t: Tensor, taken: &HashSet<usize>) -> candle_core::Result<Tensor> {
    let (key, bytes) = storage_of(&t)?;
    let own = (t.elem_count() * t.dtype().size_in_bytes()) as u64;
    let offset0 = t.layout().start_offset() == 0;
    if bytes == own && offset0 && t.is_contiguous() && !taken.contains(&key) {
        Ok(t)
    } else {
        t.force_contiguous()
    }
}
