//! Tensor shapes, element types and image sizes.

use std::fmt;
use std::str::FromStr;

/// The shape of a tensor, batch first (`[N, C, H, W]` for images, `[N, T, C]` for sequences).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shape(Vec<usize>);

impl Shape {
    /// A shape with these dimensions.
    pub fn new(dims: impl Into<Vec<usize>>) -> Shape {
        Shape(dims.into())
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements (1 for a scalar).
    pub fn elements(&self) -> u64 {
        self.0.iter().map(|&d| d as u64).product()
    }

    /// Dimension `i`.
    pub fn dim(&self, i: usize) -> usize {
        self.0[i]
    }

    /// The last dimension (0 for a scalar).
    pub fn last(&self) -> usize {
        self.0.last().copied().unwrap_or(0)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float: every activation, gradient and parameter.
    F32,
    /// 32-bit unsigned integer: token ids and class labels.
    U32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> u64 {
        4
    }
}

/// A tensor's shape with its element type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorType {
    /// The shape, batch first.
    pub shape: Shape,
    /// The element type.
    pub dtype: DType,
}

impl TensorType {
    /// An `f32` tensor.
    pub fn f32(shape: Shape) -> TensorType {
        TensorType {
            shape,
            dtype: DType::F32,
        }
    }

    /// Bytes the tensor occupies.
    pub fn bytes(&self) -> u64 {
        self.shape.elements() * self.dtype.size()
    }
}

/// Height and width of an input image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImageSize {
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
}

impl ImageSize {
    /// A square image.
    pub fn square(n: usize) -> ImageSize {
        ImageSize {
            height: n,
            width: n,
        }
    }

    /// An image of `height` rows and `width` columns.
    pub fn new(height: usize, width: usize) -> ImageSize {
        ImageSize { height, width }
    }
}

impl fmt::Display for ImageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.height == self.width {
            write!(f, "{}", self.height)
        } else {
            write!(f, "{}x{}", self.height, self.width)
        }
    }
}

impl FromStr for ImageSize {
    type Err = String;

    /// Parses `224` (square) or `416x608` (height x width).
    fn from_str(s: &str) -> Result<ImageSize, String> {
        let parse = |t: &str| {
            t.trim()
                .parse::<usize>()
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| {
                    format!("invalid image size {s:?}: expected N or HxW with positive integers")
                })
        };
        match s.split_once(['x', 'X']) {
            Some((h, w)) => Ok(ImageSize::new(parse(h)?, parse(w)?)),
            None => Ok(ImageSize::square(parse(s)?)),
        }
    }
}
