//! Where training batches come from: the synthetic dataset, or real data the user has (CIFAR-10
//! binary batches, `.npy` arrays).

use std::fs;
use std::path::{Path, PathBuf};

use candle_core::Tensor;

use crate::data::SyntheticData;
use crate::error::{Error, Result, TensorContext};
use crate::executor::{Batch, Executor};

/// A source of training batches: batch `k` is the same on every call.
pub trait BatchSource {
    /// Batch number `k` for `exec`'s network, device and dtype.
    fn batch(&self, exec: &Executor, k: u64) -> Result<Batch>;
}

impl BatchSource for SyntheticData {
    fn batch(&self, exec: &Executor, k: u64) -> Result<Batch> {
        SyntheticData::batch(self, exec, k)
    }
}

/// Examples held in memory (from CIFAR-10 or `.npy` files), served in order, wrapping around.
#[derive(Debug, Clone)]
pub struct ArrayData {
    /// Where the examples came from (for messages).
    source: String,
    /// Dimensions of one example.
    example_dims: Vec<usize>,
    /// All examples, row-major, `examples * prod(example_dims)` values.
    values: Vec<f32>,
    /// One class id per example.
    labels: Vec<u32>,
}

impl ArrayData {
    /// Reads `path`: a CIFAR-10 binary batch file (`*.bin`: records of one label byte and
    /// 3x32x32 pixel bytes, scaled to `[-1, 1]`), or a directory holding `inputs.npy` (float32,
    /// float64 or uint8, shape `[M, ...example]`) and `labels.npy` (integers, shape `[M]`).
    pub fn read(path: &Path) -> Result<ArrayData> {
        if !path.exists() {
            return Err(Error::Config(format!(
                "--data {}: no such file or directory",
                path.display()
            )));
        }
        if path.is_dir() {
            Self::read_npy_dir(path)
        } else if path.extension().is_some_and(|e| e == "bin") {
            Self::read_cifar10(path)
        } else {
            Err(Error::Config(format!(
                "--data {}: expected a CIFAR-10 binary batch (*.bin) or a directory with \
                 inputs.npy and labels.npy",
                path.display()
            )))
        }
    }

    /// Reads a CIFAR-10 binary batch (`data_batch_1.bin` ...).
    pub fn read_cifar10(path: &Path) -> Result<ArrayData> {
        const RECORD: usize = 1 + 3 * 32 * 32;
        let bytes = read_file(path)?;
        if bytes.is_empty() || bytes.len() % RECORD != 0 {
            return Err(Error::Config(format!(
                "{}: {} bytes is not a whole number of CIFAR-10 records ({RECORD} bytes each: a \
                 label byte and 3072 pixel bytes)",
                path.display(),
                bytes.len()
            )));
        }
        let n = bytes.len() / RECORD;
        let mut values = Vec::with_capacity(n * (RECORD - 1));
        let mut labels = Vec::with_capacity(n);
        for (i, rec) in bytes.chunks_exact(RECORD).enumerate() {
            if rec[0] > 9 {
                return Err(Error::Config(format!(
                    "{}: record {i} has label {}, CIFAR-10 labels are 0..=9",
                    path.display(),
                    rec[0]
                )));
            }
            labels.push(rec[0] as u32);
            values.extend(rec[1..].iter().map(|&p| p as f32 / 127.5 - 1.0));
        }
        Ok(ArrayData {
            source: path.display().to_string(),
            example_dims: vec![3, 32, 32],
            values,
            labels,
        })
    }

    /// Reads `dir/inputs.npy` and `dir/labels.npy`.
    pub fn read_npy_dir(dir: &Path) -> Result<ArrayData> {
        let xp = dir.join("inputs.npy");
        let yp = dir.join("labels.npy");
        let x = Npy::read(&xp)?;
        let y = Npy::read(&yp)?;
        if x.shape.len() < 2 {
            return Err(Error::Config(format!(
                "{}: shape {:?}; expected [examples, ...one example]",
                xp.display(),
                x.shape
            )));
        }
        if y.shape.len() != 1 || y.shape[0] != x.shape[0] {
            return Err(Error::Config(format!(
                "{}: shape {:?}; expected [{}], one label per example of {}",
                yp.display(),
                y.shape,
                x.shape[0],
                xp.display()
            )));
        }
        let labels = y
            .values
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                if v >= 0.0 && v.fract() == 0.0 && v <= u32::MAX as f64 {
                    Ok(v as u32)
                } else {
                    Err(Error::Config(format!(
                        "{}: label {i} is {v}; labels must be class ids 0, 1, 2, ...",
                        yp.display()
                    )))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ArrayData {
            source: dir.display().to_string(),
            example_dims: x.shape[1..].to_vec(),
            values: x.values.iter().map(|&v| v as f32).collect(),
            labels,
        })
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Dimensions of one example.
    pub fn example_dims(&self) -> &[usize] {
        &self.example_dims
    }

    /// Checks that the examples fit `exec`'s network (input shape, classification labels, class
    /// range), naming what to change when they do not.
    pub fn check(&self, exec: &Executor) -> Result<()> {
        let net = exec.network();
        let want = &net.input().shape.dims()[1..];
        if want != self.example_dims.as_slice() {
            return Err(Error::Config(format!(
                "{}: examples are {:?} but the network takes {want:?} per example (for CIFAR-10 \
                 use --image-size 32)",
                self.source, self.example_dims
            )));
        }
        if net.loss().labels.shape.rank() != 1 {
            return Err(Error::Config(format!(
                "{}: real data supports classification labels ([N]) only; model {} needs \
                 per-pixel labels",
                self.source,
                net.name()
            )));
        }
        let classes = exec.classes()?;
        if let Some(&bad) = self.labels.iter().find(|&&l| l as usize >= classes) {
            return Err(Error::Config(format!(
                "{}: label {bad} but the network has {classes} classes (set --classes)",
                self.source
            )));
        }
        if self.is_empty() {
            return Err(Error::Config(format!("{}: no examples", self.source)));
        }
        Ok(())
    }
}

impl BatchSource for ArrayData {
    fn batch(&self, exec: &Executor, k: u64) -> Result<Batch> {
        self.check(exec)?;
        let n = exec.network().input().shape.dims()[0];
        let per: usize = self.example_dims.iter().product();
        let mut x = Vec::with_capacity(n * per);
        let mut labels = Vec::with_capacity(n);
        for j in 0..n {
            let i = ((k as usize).wrapping_mul(n).wrapping_add(j)) % self.len();
            x.extend_from_slice(&self.values[i * per..(i + 1) * per]);
            labels.push(self.labels[i]);
        }
        let mut dims = vec![n];
        dims.extend_from_slice(&self.example_dims);
        Ok(Batch {
            input: Tensor::from_vec(x, dims, exec.device())
                .and_then(|t| t.to_dtype(exec.dtype()))
                .ctx(|| format!("batch {k} of {}", self.source))?,
            labels: Tensor::from_vec(labels, n, exec.device())
                .ctx(|| format!("labels of batch {k} of {}", self.source))?,
        })
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))
}

/// A parsed `.npy` array (NumPy format versions 1-3), values widened to `f64`.
#[derive(Debug, Clone, PartialEq)]
pub struct Npy {
    /// The array's shape.
    pub shape: Vec<usize>,
    /// Values in C order.
    pub values: Vec<f64>,
}

impl Npy {
    /// Reads and parses `path`.
    pub fn read(path: &Path) -> Result<Npy> {
        Npy::parse(&read_file(path)?).map_err(|reason| {
            Error::Config(format!(
                "{}: not a readable .npy file: {reason}",
                path.display()
            ))
        })
    }

    /// Parses `.npy` bytes; the error says what is wrong.
    pub fn parse(bytes: &[u8]) -> std::result::Result<Npy, String> {
        if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
            return Err("missing the \\x93NUMPY magic".into());
        }
        let (header_len, start) = match bytes[6] {
            1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
            2 | 3 if bytes.len() >= 12 => (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            ),
            v => return Err(format!("format version {v} is not supported (1, 2 or 3)")),
        };
        let header = bytes
            .get(start..start + header_len)
            .ok_or("the header is cut short")?;
        let header = std::str::from_utf8(header).map_err(|_| "the header is not text")?;
        let descr = dict_value(header, "descr").ok_or("the header has no 'descr'")?;
        let descr = match descr.chars().next() {
            Some(q @ ('\'' | '"')) => descr[1..].split(q).next().unwrap_or(""),
            _ => return Err("'descr' is not a quoted string".into()),
        };
        if dict_value(header, "fortran_order").is_some_and(|v| v.starts_with("True")) {
            return Err("Fortran-ordered arrays are not supported; save with C order".into());
        }
        let shape_text = dict_value(header, "shape").ok_or("the header has no 'shape'")?;
        let inner = shape_text
            .trim_start_matches('(')
            .split(')')
            .next()
            .unwrap_or("");
        let shape = inner
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<usize>()
                    .map_err(|_| format!("bad shape {shape_text}"))
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let count: usize = shape.iter().product();
        let data = &bytes[start + header_len..];
        let (size, little) = match descr.as_bytes() {
            [b'<' | b'|' | b'=', ..] => (descr[2..].parse::<usize>().unwrap_or(0), true),
            [b'>', ..] => (descr[2..].parse::<usize>().unwrap_or(0), false),
            _ => return Err(format!("dtype {descr:?} is not understood")),
        };
        let kind = descr.as_bytes().get(1).copied().unwrap_or(b'?');
        if size == 0 || data.len() < count * size {
            return Err(format!(
                "{} data bytes for {count} values of dtype {descr}",
                data.len()
            ));
        }
        let mut values = Vec::with_capacity(count);
        for chunk in data[..count * size].chunks_exact(size) {
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(chunk);
            if !little {
                b[..size].reverse();
            }
            let v = match (kind, size) {
                (b'f', 4) => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
                (b'f', 8) => f64::from_le_bytes(b),
                (b'u', 1 | 2 | 4 | 8) => u64::from_le_bytes(b) as f64,
                (b'i', 1 | 2 | 4 | 8) => {
                    let shift = 64 - 8 * size as u32;
                    ((i64::from_le_bytes(b) << shift) >> shift) as f64
                }
                (b'b', 1) => b[0] as f64,
                _ => {
                    return Err(format!(
                        "dtype {descr:?} is not supported (float, int, uint)"
                    ))
                }
            };
            values.push(v);
        }
        Ok(Npy { shape, values })
    }
}

/// The text after `'key':` in a Python dict literal, up to the end of the header.
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header
        .find(&format!("'{key}'"))
        .or_else(|| header.find(&format!("\"{key}\"")))?;
    let rest = &header[at + key.len() + 2..];
    let colon = rest.find(':')?;
    Some(rest[colon + 1..].trim_start())
}

/// The user's data (`--data PATH`) or the synthetic dataset.
#[derive(Debug, Clone)]
pub enum Dataset {
    /// Class templates plus noise ([`SyntheticData`]).
    Synthetic(SyntheticData),
    /// Real examples read from files ([`ArrayData`]).
    Arrays(ArrayData, PathBuf),
}

impl Dataset {
    /// Reads `path` when given (checked against `exec`'s network), else the synthetic dataset
    /// with `seed`.
    pub fn open(exec: &Executor, path: Option<&Path>, seed: u64) -> Result<Dataset> {
        match path {
            Some(p) => {
                let data = ArrayData::read(p)?;
                data.check(exec)?;
                Ok(Dataset::Arrays(data, p.to_path_buf()))
            }
            None => Ok(Dataset::Synthetic(SyntheticData::new(exec, 0.5, seed)?)),
        }
    }

    /// A short description for reports.
    pub fn describe(&self) -> String {
        match self {
            Dataset::Synthetic(_) => "synthetic (class templates + noise)".into(),
            Dataset::Arrays(d, p) => format!("{} ({} examples)", p.display(), d.len()),
        }
    }
}

impl BatchSource for Dataset {
    fn batch(&self, exec: &Executor, k: u64) -> Result<Batch> {
        match self {
            Dataset::Synthetic(d) => BatchSource::batch(d, exec, k),
            Dataset::Arrays(d, _) => d.batch(exec, k),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
        let mut header =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn parses_float_and_integer_arrays() {
        let data: Vec<u8> = [1.5f32, -2.0, 3.25, 0.0, 7.0, 8.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let a = Npy::parse(&npy("<f4", "(2, 3)", &data)).unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.values, vec![1.5, -2.0, 3.25, 0.0, 7.0, 8.0]);
        let data: Vec<u8> = [-3i64, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
        let b = Npy::parse(&npy("<i8", "(2,)", &data)).unwrap();
        assert_eq!(b.shape, vec![2]);
        assert_eq!(b.values, vec![-3.0, 9.0]);
        let c = Npy::parse(&npy("|u1", "(3,)", &[0, 200, 255])).unwrap();
        assert_eq!(c.values, vec![0.0, 200.0, 255.0]);
        let data: Vec<u8> = [-1i16, 2].iter().flat_map(|v| v.to_be_bytes()).collect();
        let d = Npy::parse(&npy(">i2", "(2,)", &data)).unwrap();
        assert_eq!(d.values, vec![-1.0, 2.0]);
    }

    #[test]
    fn bad_npy_files_say_what_is_wrong() {
        assert!(Npy::parse(b"hello world").unwrap_err().contains("magic"));
        let short = npy("<f8", "(4,)", &[0; 8]);
        assert!(Npy::parse(&short).unwrap_err().contains("8 data bytes"));
        let complex = npy("<c8", "(1,)", &[0; 8]);
        assert!(Npy::parse(&complex).unwrap_err().contains("not supported"));
    }
}
