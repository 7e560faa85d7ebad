//! Layer operations and their hyperparameters, as an executor needs them.
//!
//! Layouts follow candle/PyTorch: activations NCHW (images) or `[N, T, C]` (sequences), convolution
//! kernels `[out, in / groups, kh, kw]`, transposed-convolution kernels `[in, out, kh, kw]`, dense
//! kernels `[out, in]`.

use crate::shape::{DType, Shape, TensorType};

/// An activation function, standalone ([`Op::Activation`]) or fused into a convolution or dense layer
/// as Keras layers have them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activation {
    /// The identity.
    Linear,
    /// `max(x, 0)`.
    Relu,
    /// `min(max(x, 0), 6)` (MobileNet).
    Relu6,
    /// GELU, tanh approximation. Only standalone: its gradient needs the pre-activation.
    Gelu,
    /// Softmax over the feature axis: axis 1 for a convolution or standalone activation, the last
    /// axis for a dense layer.
    Softmax,
}

impl Activation {
    /// Name used in messages and docs.
    pub fn name(self) -> &'static str {
        match self {
            Activation::Linear => "linear",
            Activation::Relu => "relu",
            Activation::Relu6 => "relu6",
            Activation::Gelu => "gelu",
            Activation::Softmax => "softmax",
        }
    }

    /// Whether the gradient rule reads the activation's output (ReLU, ReLU6, softmax).
    pub fn grad_needs_output(self) -> bool {
        matches!(
            self,
            Activation::Relu | Activation::Relu6 | Activation::Softmax
        )
    }

    /// Whether the gradient rule reads the activation's input (GELU).
    pub fn grad_needs_input(self) -> bool {
        matches!(self, Activation::Gelu)
    }

    fn forward_flops_per_element(self) -> f64 {
        match self {
            Activation::Linear => 0.0,
            Activation::Relu => 1.0,
            Activation::Relu6 => 2.0,
            Activation::Gelu => 8.0,
            Activation::Softmax => 5.0,
        }
    }

    pub(crate) fn backward_flops_per_element(self) -> f64 {
        match self {
            Activation::Linear => 0.0,
            Activation::Relu => 1.0,
            Activation::Relu6 => 2.0,
            Activation::Gelu => 10.0,
            Activation::Softmax => 4.0,
        }
    }
}

/// Spatial padding of a convolution or pooling window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Padding {
    /// No padding (Keras `"valid"`).
    Valid,
    /// Keras/TensorFlow `"same"`: output size `ceil(input / stride)`; the total padding is split with
    /// the extra row/column at the bottom/right.
    Same,
    /// Explicit `[top, bottom, left, right]`.
    Explicit([usize; 4]),
}

impl Padding {
    /// `[top, bottom, left, right]` for an input of `hw` with this window.
    pub fn resolve(
        self,
        hw: [usize; 2],
        kernel: [usize; 2],
        stride: [usize; 2],
        dilation: [usize; 2],
    ) -> [usize; 4] {
        match self {
            Padding::Valid => [0; 4],
            Padding::Explicit(p) => p,
            Padding::Same => {
                let mut out = [0usize; 4];
                for a in 0..2 {
                    let eff = dilation[a] * (kernel[a] - 1) + 1;
                    let o = hw[a].div_ceil(stride[a]);
                    let total = ((o - 1) * stride[a] + eff).saturating_sub(hw[a]);
                    out[2 * a] = total / 2;
                    out[2 * a + 1] = total - total / 2;
                }
                out
            }
        }
    }
}

/// 2-D convolution (also grouped and depthwise), with optional bias and fused activation.
#[derive(Debug, Clone, PartialEq)]
pub struct Conv2d {
    /// Output channels.
    pub filters: usize,
    /// Kernel `[height, width]`.
    pub kernel: [usize; 2],
    /// Stride `[rows, cols]`.
    pub stride: [usize; 2],
    /// Padding.
    pub padding: Padding,
    /// Dilation `[rows, cols]`.
    pub dilation: [usize; 2],
    /// Groups: 1 for a dense convolution, the input channels for a depthwise one.
    pub groups: usize,
    /// Whether a bias is added.
    pub bias: bool,
    /// Fused activation (Linear, Relu, Relu6 or Softmax).
    pub activation: Activation,
}

impl Conv2d {
    /// A `kernel x kernel` convolution to `filters` channels: stride 1, valid padding, bias, linear.
    pub fn new(filters: usize, kernel: usize) -> Conv2d {
        Conv2d {
            filters,
            kernel: [kernel, kernel],
            stride: [1, 1],
            padding: Padding::Valid,
            dilation: [1, 1],
            groups: 1,
            bias: true,
            activation: Activation::Linear,
        }
    }

    /// A depthwise convolution (Keras `DepthwiseConv2D`): `channels * multiplier` outputs, one group
    /// per input channel, no bias.
    pub fn depthwise(channels: usize, multiplier: usize, kernel: usize) -> Conv2d {
        Conv2d {
            groups: channels,
            bias: false,
            ..Conv2d::new(channels * multiplier, kernel)
        }
    }

    /// Sets a non-square kernel.
    pub fn kernel_hw(mut self, height: usize, width: usize) -> Conv2d {
        self.kernel = [height, width];
        self
    }

    /// Sets the same stride in both directions.
    pub fn stride(mut self, s: usize) -> Conv2d {
        self.stride = [s, s];
        self
    }

    /// Keras `padding="same"`.
    pub fn same(mut self) -> Conv2d {
        self.padding = Padding::Same;
        self
    }

    /// Sets the padding.
    pub fn padding(mut self, p: Padding) -> Conv2d {
        self.padding = p;
        self
    }

    /// Sets the same dilation in both directions.
    pub fn dilation(mut self, d: usize) -> Conv2d {
        self.dilation = [d, d];
        self
    }

    /// Sets the number of groups.
    pub fn groups(mut self, g: usize) -> Conv2d {
        self.groups = g;
        self
    }

    /// Removes the bias.
    pub fn no_bias(mut self) -> Conv2d {
        self.bias = false;
        self
    }

    /// Sets the fused activation.
    pub fn activation(mut self, a: Activation) -> Conv2d {
        self.activation = a;
        self
    }

    /// Fuses a ReLU.
    pub fn relu(self) -> Conv2d {
        self.activation(Activation::Relu)
    }

    /// `[top, bottom, left, right]` padding for an input of spatial size `hw`.
    pub fn padding_for(&self, hw: [usize; 2]) -> [usize; 4] {
        self.padding
            .resolve(hw, self.kernel, self.stride, self.dilation)
    }
}

/// 2-D transposed convolution (Keras `Conv2DTranspose`), one group.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvTranspose2d {
    /// Output channels.
    pub filters: usize,
    /// Kernel `[height, width]`.
    pub kernel: [usize; 2],
    /// Stride `[rows, cols]`.
    pub stride: [usize; 2],
    /// `Valid` (output `(in - 1) * stride + kernel`), `Same` (output `in * stride`, needs
    /// kernel >= stride) or `Explicit` rows/columns cropped from the valid output.
    pub padding: Padding,
    /// Whether a bias is added.
    pub bias: bool,
    /// Fused activation (Linear, Relu, Relu6 or Softmax).
    pub activation: Activation,
}

impl ConvTranspose2d {
    /// A `kernel x kernel` transposed convolution with this stride, valid padding, bias, linear.
    pub fn new(filters: usize, kernel: usize, stride: usize) -> ConvTranspose2d {
        ConvTranspose2d {
            filters,
            kernel: [kernel, kernel],
            stride: [stride, stride],
            padding: Padding::Valid,
            bias: true,
            activation: Activation::Linear,
        }
    }

    /// Removes the bias.
    pub fn no_bias(mut self) -> ConvTranspose2d {
        self.bias = false;
        self
    }

    /// `[top, bottom, left, right]` rows/columns cropped from the full (valid) output.
    pub fn crop_for(&self) -> [usize; 4] {
        match self.padding {
            Padding::Valid => [0; 4],
            Padding::Explicit(p) => p,
            Padding::Same => {
                let mut out = [0usize; 4];
                for a in 0..2 {
                    let total = self.kernel[a].saturating_sub(self.stride[a]);
                    out[2 * a] = total / 2;
                    out[2 * a + 1] = total - total / 2;
                }
                out
            }
        }
    }
}

/// Fully connected layer on the last axis, with optional bias and fused activation.
#[derive(Debug, Clone, PartialEq)]
pub struct Dense {
    /// Output features.
    pub units: usize,
    /// Whether a bias is added.
    pub bias: bool,
    /// Fused activation (Linear, Relu, Relu6 or Softmax over the last axis).
    pub activation: Activation,
}

impl Dense {
    /// A dense layer with bias and no activation.
    pub fn new(units: usize) -> Dense {
        Dense {
            units,
            bias: true,
            activation: Activation::Linear,
        }
    }

    /// Sets the fused activation.
    pub fn activation(mut self, a: Activation) -> Dense {
        self.activation = a;
        self
    }

    /// Fuses a ReLU.
    pub fn relu(self) -> Dense {
        self.activation(Activation::Relu)
    }

    /// Fuses a softmax over the output features.
    pub fn softmax(self) -> Dense {
        self.activation(Activation::Softmax)
    }
}

/// Max or average pooling window.
#[derive(Debug, Clone, PartialEq)]
pub struct Pool2d {
    /// Window `[height, width]`.
    pub pool: [usize; 2],
    /// Stride `[rows, cols]`.
    pub stride: [usize; 2],
    /// Padding (padded cells never win a max and are not counted in an average).
    pub padding: Padding,
}

impl Pool2d {
    /// A `pool x pool` window with stride `stride`, valid padding.
    pub fn new(pool: usize, stride: usize) -> Pool2d {
        Pool2d {
            pool: [pool, pool],
            stride: [stride, stride],
            padding: Padding::Valid,
        }
    }

    /// `[top, bottom, left, right]` padding for an input of spatial size `hw`.
    pub fn padding_for(&self, hw: [usize; 2]) -> [usize; 4] {
        self.padding.resolve(hw, self.pool, self.stride, [1, 1])
    }
}

/// Batch normalization over axis 1 (channels), training mode (batch statistics).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchNorm {
    /// Added to the variance.
    pub epsilon: f64,
    /// Running-statistics momentum (Keras convention: `running = momentum * running + (1 -
    /// momentum) * batch`).
    pub momentum: f64,
}

impl Default for BatchNorm {
    /// Keras defaults: epsilon 1e-3, momentum 0.99.
    fn default() -> BatchNorm {
        BatchNorm {
            epsilon: 1e-3,
            momentum: 0.99,
        }
    }
}

/// Multi-head self-attention on `[N, T, C]` with fused QKV and output projections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SelfAttention {
    /// Number of heads; must divide the width.
    pub heads: usize,
    /// Whether position `t` attends only to positions `<= t` (GPT).
    pub causal: bool,
}

/// A layer's operation with its hyperparameters.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// 2-D convolution.
    Conv2d(Conv2d),
    /// 2-D transposed convolution.
    ConvTranspose2d(ConvTranspose2d),
    /// Dense layer on the last axis.
    Dense(Dense),
    /// Max pooling.
    MaxPool2d(Pool2d),
    /// Average pooling.
    AvgPool2d(Pool2d),
    /// Mean over H and W: `[N, C, H, W] -> [N, C]`.
    GlobalAvgPool2d,
    /// Batch normalization over channels (axis 1).
    BatchNorm(BatchNorm),
    /// Layer normalization over the last axis, with scale and shift.
    LayerNorm {
        /// Added to the variance.
        epsilon: f64,
    },
    /// Elementwise activation (softmax over axis 1).
    Activation(Activation),
    /// Sum of two or more tensors of one shape.
    Add,
    /// Concatenation along `axis` (1 = channels).
    Concat {
        /// The axis, >= 1.
        axis: usize,
    },
    /// Nearest-neighbour upsampling by `[rows, cols]`.
    UpSampling2d {
        /// Scale factors.
        scale: [usize; 2],
    },
    /// Zero padding `[top, bottom, left, right]`.
    ZeroPadding2d {
        /// Rows/columns added.
        padding: [usize; 4],
    },
    /// Cropping `[top, bottom, left, right]`.
    Cropping2d {
        /// Rows/columns removed.
        cropping: [usize; 4],
    },
    /// `[N, ...] -> [N, product]`.
    Flatten,
    /// `[N, ...] -> [N, dims...]` with the same number of elements.
    Reshape {
        /// The new non-batch dimensions.
        dims: Vec<usize>,
    },
    /// Inverted dropout: zero with probability `rate`, scale the rest by `1 / (1 - rate)`. A
    /// recompute must replay the same mask.
    Dropout {
        /// Drop probability in `[0, 1)`.
        rate: f32,
    },
    /// Token embedding: `u32` ids `[N, T] -> [N, T, dim]`.
    Embedding {
        /// Vocabulary size.
        vocab: usize,
        /// Embedding width.
        dim: usize,
    },
    /// Adds a learned position embedding `[max_len, C]` to `[N, T, C]` (first `T` rows).
    PositionEmbedding {
        /// Longest sequence.
        max_len: usize,
    },
    /// Multi-head self-attention.
    SelfAttention(SelfAttention),
}

/// A parameter tensor of a layer.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// Name within the layer: `kernel`, `bias`, `gamma`, `beta`, `running_mean`, ...
    pub name: &'static str,
    /// Shape (layouts in the module docs).
    pub shape: Shape,
    /// `false` for batch-norm running statistics (updated, not trained).
    pub trainable: bool,
}

/// What an operation's gradient rule reads besides the upstream gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GradNeeds {
    /// The layer's inputs (all of them).
    pub inputs: bool,
    /// The layer's output.
    pub output: bool,
}

/// Why shape inference failed (the caller adds the layer name).
pub(crate) enum OpError {
    Shape(String),
    Hyper(String),
}

fn shape_err<T>(msg: impl Into<String>) -> Result<T, OpError> {
    Err(OpError::Shape(msg.into()))
}

fn hyper_err<T>(msg: impl Into<String>) -> Result<T, OpError> {
    Err(OpError::Hyper(msg.into()))
}

fn positive(name: &str, v: &[usize]) -> Result<(), OpError> {
    if v.contains(&0) {
        return hyper_err(format!("{name} must be positive, got {v:?}"));
    }
    Ok(())
}

fn fusable(a: Activation) -> Result<(), OpError> {
    if a == Activation::Gelu {
        return hyper_err(
            "a fused GELU needs the pre-activation for its gradient; use a separate GELU layer",
        );
    }
    Ok(())
}

fn rank4(t: &TensorType) -> Result<[usize; 4], OpError> {
    match t.shape.dims() {
        &[n, c, h, w] => Ok([n, c, h, w]),
        _ => shape_err(format!("expects a 4-D [N, C, H, W] input, got {}", t.shape)),
    }
}

/// Output size of a sliding window along one axis, or an error naming the axis.
fn window_out(
    axis: &str,
    input: usize,
    pad: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
) -> Result<usize, OpError> {
    let eff = dilation * (kernel - 1) + 1;
    let padded = input + pad;
    if padded < eff {
        return shape_err(format!(
            "{axis}: window {eff} (kernel {kernel}, dilation {dilation}) is larger than the padded input {padded}"
        ));
    }
    Ok((padded - eff) / stride + 1)
}

impl Op {
    /// Short name of the operation kind (`conv2d`, `dense`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Conv2d(_) => "conv2d",
            Op::ConvTranspose2d(_) => "conv_transpose2d",
            Op::Dense(_) => "dense",
            Op::MaxPool2d(_) => "max_pool2d",
            Op::AvgPool2d(_) => "avg_pool2d",
            Op::GlobalAvgPool2d => "global_avg_pool2d",
            Op::BatchNorm(_) => "batch_norm",
            Op::LayerNorm { .. } => "layer_norm",
            Op::Activation(_) => "activation",
            Op::Add => "add",
            Op::Concat { .. } => "concat",
            Op::UpSampling2d { .. } => "up_sampling2d",
            Op::ZeroPadding2d { .. } => "zero_padding2d",
            Op::Cropping2d { .. } => "cropping2d",
            Op::Flatten => "flatten",
            Op::Reshape { .. } => "reshape",
            Op::Dropout { .. } => "dropout",
            Op::Embedding { .. } => "embedding",
            Op::PositionEmbedding { .. } => "position_embedding",
            Op::SelfAttention(_) => "self_attention",
        }
    }

    /// The activation applied last (fused or standalone), if any.
    pub fn activation(&self) -> Activation {
        match self {
            Op::Conv2d(c) => c.activation,
            Op::ConvTranspose2d(c) => c.activation,
            Op::Dense(d) => d.activation,
            Op::Activation(a) => *a,
            _ => Activation::Linear,
        }
    }

    /// The axis a softmax produced by this op runs over, for an output of rank `rank`.
    pub(crate) fn softmax_axis(&self, rank: usize) -> Option<usize> {
        if self.activation() != Activation::Softmax {
            return None;
        }
        match self {
            Op::Dense(_) => Some(rank - 1),
            _ => Some(1),
        }
    }

    /// What the gradient rule reads besides the upstream gradient (see docs/MODELS.md).
    pub fn grad_needs(&self) -> GradNeeds {
        let (inputs, output) = match self {
            Op::Conv2d(_) | Op::ConvTranspose2d(_) | Op::Dense(_) => {
                (true, self.activation().grad_needs_output())
            }
            Op::MaxPool2d(_) => (true, true),
            Op::BatchNorm(_) | Op::LayerNorm { .. } | Op::SelfAttention(_) => (true, false),
            Op::Embedding { .. } => (true, false),
            Op::Activation(a) => (a.grad_needs_input(), a.grad_needs_output()),
            Op::AvgPool2d(_)
            | Op::GlobalAvgPool2d
            | Op::Add
            | Op::Concat { .. }
            | Op::UpSampling2d { .. }
            | Op::ZeroPadding2d { .. }
            | Op::Cropping2d { .. }
            | Op::Flatten
            | Op::Reshape { .. }
            | Op::Dropout { .. }
            | Op::PositionEmbedding { .. } => (false, false),
        };
        GradNeeds { inputs, output }
    }

    /// Whether the backward pass produces one gradient tensor shared by all inputs (Add), instead
    /// of one per input.
    pub fn shares_input_gradient(&self) -> bool {
        matches!(self, Op::Add)
    }

    /// Checks hyperparameters and input types and returns the output shape.
    pub(crate) fn infer(&self, inputs: &[TensorType]) -> Result<Shape, OpError> {
        let multi = matches!(self, Op::Add | Op::Concat { .. });
        if multi && inputs.len() < 2 {
            return shape_err(format!("needs at least 2 inputs, got {}", inputs.len()));
        }
        if !multi && inputs.len() != 1 {
            return shape_err(format!("needs exactly 1 input, got {}", inputs.len()));
        }
        for (i, t) in inputs.iter().enumerate() {
            let want = if matches!(self, Op::Embedding { .. }) {
                DType::U32
            } else {
                DType::F32
            };
            if t.dtype != want {
                return shape_err(format!("input #{i} must be {want:?}, got {:?}", t.dtype));
            }
            if t.shape.rank() == 0 || t.shape.dims().contains(&0) {
                return shape_err(format!("input #{i} has an empty shape {}", t.shape));
            }
        }
        let x = &inputs[0];
        let dims = x.shape.dims();
        match self {
            Op::Conv2d(c) => {
                positive("filters", &[c.filters])?;
                positive("kernel", &c.kernel)?;
                positive("stride", &c.stride)?;
                positive("dilation", &c.dilation)?;
                positive("groups", &[c.groups])?;
                fusable(c.activation)?;
                let [n, ch, h, w] = rank4(x)?;
                if ch % c.groups != 0 || c.filters % c.groups != 0 {
                    return shape_err(format!(
                        "groups {} must divide input channels {ch} and filters {} (input {})",
                        c.groups, c.filters, x.shape
                    ));
                }
                let p = c.padding_for([h, w]);
                let oh = window_out(
                    "height",
                    h,
                    p[0] + p[1],
                    c.kernel[0],
                    c.stride[0],
                    c.dilation[0],
                )?;
                let ow = window_out(
                    "width",
                    w,
                    p[2] + p[3],
                    c.kernel[1],
                    c.stride[1],
                    c.dilation[1],
                )?;
                Ok(Shape::new([n, c.filters, oh, ow]))
            }
            Op::ConvTranspose2d(c) => {
                positive("filters", &[c.filters])?;
                positive("kernel", &c.kernel)?;
                positive("stride", &c.stride)?;
                fusable(c.activation)?;
                if c.padding == Padding::Same
                    && (c.kernel[0] < c.stride[0] || c.kernel[1] < c.stride[1])
                {
                    return hyper_err("\"same\" padding needs kernel >= stride");
                }
                let [n, _, h, w] = rank4(x)?;
                let crop = c.crop_for();
                let full = [
                    (h - 1) * c.stride[0] + c.kernel[0],
                    (w - 1) * c.stride[1] + c.kernel[1],
                ];
                if crop[0] + crop[1] >= full[0] || crop[2] + crop[3] >= full[1] {
                    return shape_err(format!(
                        "padding {crop:?} removes the whole output {full:?}"
                    ));
                }
                Ok(Shape::new([
                    n,
                    c.filters,
                    full[0] - crop[0] - crop[1],
                    full[1] - crop[2] - crop[3],
                ]))
            }
            Op::Dense(d) => {
                positive("units", &[d.units])?;
                fusable(d.activation)?;
                if dims.len() < 2 {
                    return shape_err(format!(
                        "expects a [N, ..., features] input, got {}",
                        x.shape
                    ));
                }
                let mut out = dims.to_vec();
                *out.last_mut().expect("rank >= 2") = d.units;
                Ok(Shape::new(out))
            }
            Op::MaxPool2d(p) | Op::AvgPool2d(p) => {
                positive("pool", &p.pool)?;
                positive("stride", &p.stride)?;
                let [n, ch, h, w] = rank4(x)?;
                let pad = p.padding_for([h, w]);
                if pad[0].max(pad[1]) >= p.pool[0] || pad[2].max(pad[3]) >= p.pool[1] {
                    return hyper_err(format!(
                        "padding {pad:?} must be smaller than the window {:?}",
                        p.pool
                    ));
                }
                let oh = window_out("height", h, pad[0] + pad[1], p.pool[0], p.stride[0], 1)?;
                let ow = window_out("width", w, pad[2] + pad[3], p.pool[1], p.stride[1], 1)?;
                Ok(Shape::new([n, ch, oh, ow]))
            }
            Op::GlobalAvgPool2d => {
                let [n, ch, _, _] = rank4(x)?;
                Ok(Shape::new([n, ch]))
            }
            Op::BatchNorm(b) => {
                if b.epsilon.is_nan() || b.epsilon <= 0.0 || !(0.0..1.0).contains(&b.momentum) {
                    return hyper_err("epsilon must be > 0 and momentum in [0, 1)");
                }
                if dims.len() < 2 {
                    return shape_err(format!("expects [N, C, ...], got {}", x.shape));
                }
                Ok(x.shape.clone())
            }
            Op::LayerNorm { epsilon } => {
                if epsilon.is_nan() || *epsilon <= 0.0 {
                    return hyper_err("epsilon must be > 0");
                }
                if dims.len() < 2 {
                    return shape_err(format!("expects [N, ..., C], got {}", x.shape));
                }
                Ok(x.shape.clone())
            }
            Op::Activation(a) => {
                if *a == Activation::Softmax && dims.len() < 2 {
                    return shape_err(format!(
                        "softmax over axis 1 needs rank >= 2, got {}",
                        x.shape
                    ));
                }
                Ok(x.shape.clone())
            }
            Op::Add => {
                for (i, t) in inputs.iter().enumerate().skip(1) {
                    if t.shape != x.shape {
                        return shape_err(format!(
                            "all inputs must have one shape: input #0 is {}, input #{i} is {}",
                            x.shape, t.shape
                        ));
                    }
                }
                Ok(x.shape.clone())
            }
            Op::Concat { axis } => {
                let axis = *axis;
                if axis == 0 || axis >= dims.len() {
                    return hyper_err(format!(
                        "axis {axis} must be in 1..{} (not the batch axis)",
                        dims.len()
                    ));
                }
                let mut out = dims.to_vec();
                for (i, t) in inputs.iter().enumerate().skip(1) {
                    let d = t.shape.dims();
                    let ok = d.len() == dims.len()
                        && d.iter()
                            .zip(dims)
                            .enumerate()
                            .all(|(k, (a, b))| k == axis || a == b);
                    if !ok {
                        return shape_err(format!(
                            "inputs must agree except on axis {axis}: input #0 is {}, input #{i} is {}",
                            x.shape, t.shape
                        ));
                    }
                    out[axis] += d[axis];
                }
                Ok(Shape::new(out))
            }
            Op::UpSampling2d { scale } => {
                positive("scale", scale)?;
                let [n, ch, h, w] = rank4(x)?;
                Ok(Shape::new([n, ch, h * scale[0], w * scale[1]]))
            }
            Op::ZeroPadding2d { padding: p } => {
                let [n, ch, h, w] = rank4(x)?;
                Ok(Shape::new([n, ch, h + p[0] + p[1], w + p[2] + p[3]]))
            }
            Op::Cropping2d { cropping: p } => {
                let [n, ch, h, w] = rank4(x)?;
                if p[0] + p[1] >= h || p[2] + p[3] >= w {
                    return shape_err(format!("cropping {p:?} removes all of the {h}x{w} input"));
                }
                Ok(Shape::new([n, ch, h - p[0] - p[1], w - p[2] - p[3]]))
            }
            Op::Flatten => {
                if dims.len() < 2 {
                    return shape_err(format!("expects rank >= 2, got {}", x.shape));
                }
                Ok(Shape::new([dims[0], dims[1..].iter().product()]))
            }
            Op::Reshape { dims: to } => {
                positive("dims", to)?;
                let want: usize = dims[1..].iter().product();
                let got: usize = to.iter().product();
                if want != got {
                    return shape_err(format!(
                        "cannot reshape {} ({want} elements per example) to {to:?} ({got})",
                        x.shape
                    ));
                }
                let mut out = vec![dims[0]];
                out.extend_from_slice(to);
                Ok(Shape::new(out))
            }
            Op::Dropout { rate } => {
                if !(0.0..1.0).contains(rate) {
                    return hyper_err(format!("rate {rate} must be in [0, 1)"));
                }
                Ok(x.shape.clone())
            }
            Op::Embedding { vocab, dim } => {
                positive("vocab and dim", &[*vocab, *dim])?;
                match dims {
                    &[n, t] => Ok(Shape::new([n, t, *dim])),
                    _ => shape_err(format!("expects token ids [N, T], got {}", x.shape)),
                }
            }
            Op::PositionEmbedding { max_len } => match *dims {
                [_, t, _] if t <= *max_len => Ok(x.shape.clone()),
                [_, t, _] => shape_err(format!("sequence length {t} exceeds max_len {max_len}")),
                _ => shape_err(format!("expects [N, T, C], got {}", x.shape)),
            },
            Op::SelfAttention(a) => {
                positive("heads", &[a.heads])?;
                match *dims {
                    [_, _, c] if c % a.heads == 0 => Ok(x.shape.clone()),
                    [_, _, c] => shape_err(format!("{} heads do not divide width {c}", a.heads)),
                    _ => shape_err(format!("expects [N, T, C], got {}", x.shape)),
                }
            }
        }
    }

    /// The layer's parameters for these (already checked) inputs.
    pub(crate) fn params(&self, inputs: &[TensorType]) -> Vec<ParamSpec> {
        let p = |name, dims: Vec<usize>| ParamSpec {
            name,
            shape: Shape::new(dims),
            trainable: true,
        };
        let dims = inputs[0].shape.dims();
        let mut out = Vec::new();
        match self {
            Op::Conv2d(c) => {
                out.push(p(
                    "kernel",
                    vec![c.filters, dims[1] / c.groups, c.kernel[0], c.kernel[1]],
                ));
                if c.bias {
                    out.push(p("bias", vec![c.filters]));
                }
            }
            Op::ConvTranspose2d(c) => {
                out.push(p(
                    "kernel",
                    vec![dims[1], c.filters, c.kernel[0], c.kernel[1]],
                ));
                if c.bias {
                    out.push(p("bias", vec![c.filters]));
                }
            }
            Op::Dense(d) => {
                out.push(p("kernel", vec![d.units, *dims.last().expect("rank >= 2")]));
                if d.bias {
                    out.push(p("bias", vec![d.units]));
                }
            }
            Op::BatchNorm(_) => {
                let c = dims[1];
                out.push(p("gamma", vec![c]));
                out.push(p("beta", vec![c]));
                for name in ["running_mean", "running_var"] {
                    out.push(ParamSpec {
                        name,
                        shape: Shape::new([c]),
                        trainable: false,
                    });
                }
            }
            Op::LayerNorm { .. } => {
                let c = *dims.last().expect("rank >= 2");
                out.push(p("gamma", vec![c]));
                out.push(p("beta", vec![c]));
            }
            Op::Embedding { vocab, dim } => out.push(p("weight", vec![*vocab, *dim])),
            Op::PositionEmbedding { max_len } => out.push(p("weight", vec![*max_len, dims[2]])),
            Op::SelfAttention(_) => {
                let c = dims[2];
                out.push(p("qkv_kernel", vec![3 * c, c]));
                out.push(p("qkv_bias", vec![3 * c]));
                out.push(p("out_kernel", vec![c, c]));
                out.push(p("out_bias", vec![c]));
            }
            _ => {}
        }
        out
    }

    /// Multiply-adds of the op's matrix product part (0 for other ops).
    fn macs(&self, inputs: &[TensorType], output: &Shape) -> f64 {
        let out = output.elements() as f64;
        let dims = inputs[0].shape.dims();
        match self {
            Op::Conv2d(c) => out * (dims[1] / c.groups) as f64 * (c.kernel[0] * c.kernel[1]) as f64,
            Op::ConvTranspose2d(c) => {
                inputs[0].shape.elements() as f64 * (c.filters * c.kernel[0] * c.kernel[1]) as f64
            }
            Op::Dense(_) => out * *dims.last().expect("rank >= 2") as f64,
            _ => 0.0,
        }
    }

    /// Attention FLOPs of one forward pass: projections, scores, softmax, weighted sum.
    fn attention_flops(a: &SelfAttention, shape: &Shape) -> f64 {
        let [n, t, c] = [
            shape.dim(0) as f64,
            shape.dim(1) as f64,
            shape.dim(2) as f64,
        ];
        let rows = n * t;
        let proj = 2.0 * rows * c * 3.0 * c + 3.0 * rows * c + 2.0 * rows * c * c + rows * c;
        let scores = 2.0 * n * t * t * c;
        let softmax = 5.0 * n * a.heads as f64 * t * t;
        proj + 2.0 * scores + softmax
    }

    /// FLOPs of one forward computation (multiply-add = 2).
    pub(crate) fn forward_flops(&self, inputs: &[TensorType], output: &Shape) -> f64 {
        let out = output.elements() as f64;
        let inp = inputs[0].shape.elements() as f64;
        match self {
            Op::Conv2d(_) | Op::ConvTranspose2d(_) | Op::Dense(_) => {
                let bias = match self {
                    Op::Conv2d(c) => c.bias,
                    Op::ConvTranspose2d(c) => c.bias,
                    Op::Dense(d) => d.bias,
                    _ => false,
                };
                2.0 * self.macs(inputs, output)
                    + if bias { out } else { 0.0 }
                    + out * self.activation().forward_flops_per_element()
            }
            Op::MaxPool2d(p) | Op::AvgPool2d(p) => out * (p.pool[0] * p.pool[1]) as f64,
            Op::GlobalAvgPool2d => inp,
            Op::BatchNorm(_) | Op::LayerNorm { .. } => 8.0 * out,
            Op::Activation(a) => out * a.forward_flops_per_element(),
            Op::Add => (inputs.len() - 1) as f64 * out,
            Op::Dropout { .. } => 2.0 * out,
            Op::PositionEmbedding { .. } => out,
            Op::SelfAttention(a) => Op::attention_flops(a, output),
            Op::Concat { .. }
            | Op::UpSampling2d { .. }
            | Op::ZeroPadding2d { .. }
            | Op::Cropping2d { .. }
            | Op::Flatten
            | Op::Reshape { .. }
            | Op::Embedding { .. } => 0.0,
        }
    }

    /// FLOPs of one backward computation: parameter gradients always, input gradients only where
    /// `any_input_grad`.
    pub(crate) fn backward_flops(
        &self,
        inputs: &[TensorType],
        output: &Shape,
        any_input_grad: bool,
    ) -> f64 {
        let out = output.elements() as f64;
        let inp = inputs[0].shape.elements() as f64;
        match self {
            Op::Conv2d(_) | Op::ConvTranspose2d(_) | Op::Dense(_) => {
                let macs = self.macs(inputs, output);
                let bias = match self {
                    Op::Conv2d(c) => c.bias,
                    Op::ConvTranspose2d(c) => c.bias,
                    Op::Dense(d) => d.bias,
                    _ => false,
                };
                2.0 * macs
                    + if any_input_grad { 2.0 * macs } else { 0.0 }
                    + if bias { out } else { 0.0 }
                    + out * self.activation().backward_flops_per_element()
            }
            Op::MaxPool2d(p) => out * (p.pool[0] * p.pool[1]) as f64 + inp,
            Op::AvgPool2d(p) => out * (p.pool[0] * p.pool[1]) as f64,
            Op::GlobalAvgPool2d => inp,
            Op::BatchNorm(_) | Op::LayerNorm { .. } => {
                if any_input_grad {
                    12.0 * out
                } else {
                    4.0 * out
                }
            }
            Op::Activation(a) => out * a.backward_flops_per_element(),
            Op::UpSampling2d { .. } | Op::Dropout { .. } | Op::Embedding { .. } => out,
            Op::PositionEmbedding { .. } => out,
            Op::SelfAttention(a) => 3.0 * Op::attention_flops(a, output),
            Op::Add
            | Op::Concat { .. }
            | Op::ZeroPadding2d { .. }
            | Op::Cropping2d { .. }
            | Op::Flatten
            | Op::Reshape { .. } => 0.0,
        }
    }

    /// Scratch bytes live only during the forward computation: attention's projections and scores; a
    /// convolution's one chunk of unfolded windows ([`conv_chunk_bytes`]).
    pub(crate) fn forward_workspace(&self, inputs: &[TensorType], output: &Shape) -> u64 {
        match self {
            Op::SelfAttention(a) => {
                let [n, t, c] = [
                    output.dim(0) as u64,
                    output.dim(1) as u64,
                    output.dim(2) as u64,
                ];
                // The executor's kernel at its high-water mark (measured at three lengths with
                // the counting allocator, exact): the QKV projection and its bias sum, the heads'
                // Q, K, V and transposed K, the attention output, the output projection (seven
                // `[N, T, C]` tensors) and two score tensors `[N, heads, T, T]`.
                4 * (7 * n * t * c + 2 * n * a.heads as u64 * t * t)
            }
            Op::Conv2d(c) => conv_window_positions(c, inputs, output)
                .map_or(0, |(window, positions)| conv_chunk_bytes(window, positions)),
            // The convolution it transposes: windows over the output's channels, one row per
            // input position.
            Op::ConvTranspose2d(c) => match inputs.first() {
                Some(x) if x.shape.rank() == 4 => conv_chunk_bytes(
                    c.filters * c.kernel[0] * c.kernel[1],
                    x.shape.dim(2) * x.shape.dim(3),
                ),
                _ => 0,
            },
            _ => 0,
        }
    }

    /// Scratch bytes of the backward computation beyond the upstream-gradient temporaries:
    /// attention recomputes its forward and holds the gradients of every part (twice the forward
    /// scratch, a bound: the kernel's high-water mark is 8-14% below it); a convolution reuses one
    /// chunk buffer for the windows and their gradients.
    ///
    /// A convolution followed by ReLU also masks its upstream gradient chunk by chunk
    /// ([`conv_masked_bytes`]) instead of forming the masked gradient whole.
    pub(crate) fn backward_workspace(&self, inputs: &[TensorType], output: &Shape) -> u64 {
        match self {
            Op::SelfAttention(_) => 2 * self.forward_workspace(inputs, output),
            Op::Conv2d(c) if c.activation == Activation::Relu => {
                conv_window_positions(c, inputs, output).map_or(0, |(window, positions)| {
                    conv_chunk_bytes(window, positions)
                        + conv_masked_bytes(window, positions, c.filters / c.groups.max(1))
                })
            }
            _ => self.forward_workspace(inputs, output),
        }
    }
}

impl Op {
    /// Scratch of a convolution fused with the max pooling after it
    /// ([`crate::TrainingConfig::fuse_conv_pool`]), in f32 bytes: the convolution's node holds
    /// its chunk of unfolded windows, that chunk's outputs (`rows * filters_per_group`) and, per
    /// channel of a group and window of a row of windows, the running maximum and its cell
    /// (5 bytes); the pooling's node unfolds one window's cells at a time (`cells * window`).
    /// Zero for anything but a convolution on NCHW tensors.
    pub(crate) fn fused_pool_workspace(
        &self,
        inputs: &[TensorType],
        output: &Shape,
        pooled: &Shape,
        pool: [usize; 2],
    ) -> (u64, u64) {
        let Op::Conv2d(c) = self else {
            return (0, 0);
        };
        let Some((window, positions)) = conv_window_positions(c, inputs, output) else {
            return (0, 0);
        };
        let opg = c.filters / c.groups.max(1);
        let rows = conv_chunk_rows(window, positions, 4);
        let conv = conv_chunk_bytes(window, positions)
            + (4 * rows * opg) as u64
            + (5 * opg * pooled.dim(pooled.rank() - 1)) as u64;
        let pool_ws = (4 * pool[0] * pool[1] * window) as u64;
        (conv, pool_ws)
    }
}

/// The name of a convolution's second implementation on the CPU: each sample's windows unfolded
/// at once (one matrix product per sample and group) instead of in chunks of
/// [`CONV_CHUNK_BYTES`]. Faster on deep layers (the kernel matrix is packed once per sample),
/// with a workspace of a whole sample's windows; the same bits (docs/IMPLEMENTATIONS.md).
pub const WHOLE_SAMPLE: &str = "whole-sample";

/// The most gemm's packing buffers grow by when a convolution unfolds a whole sample.
const WHOLE_SAMPLE_PACKING: u64 = 1 << 20;

/// The chunk bound of the CPU convolution for implementation `name` of a convolution node:
/// [`CONV_CHUNK_BYTES`] for the default, unbounded (one sample) for [`WHOLE_SAMPLE`].
pub fn conv_chunk_bytes_of(name: &str) -> Option<usize> {
    match name {
        checkmate_graph::DEFAULT_IMPLEMENTATION => Some(CONV_CHUNK_BYTES),
        WHOLE_SAMPLE => Some(usize::MAX),
        _ => None,
    }
}

impl Op {
    /// Extra workspace of a convolution's [`WHOLE_SAMPLE`] implementation over its default, for
    /// its forward (`backward` false) or its input gradient (`backward`, with `masked`: the
    /// upstream gradient is masked chunk by chunk); `None` where a sample's windows fit in one
    /// chunk anyway (the two are the same kernel) or the op is not a convolution.
    pub fn whole_sample_extra(
        &self,
        inputs: &[TensorType],
        output: &Shape,
        backward: bool,
        masked: bool,
    ) -> Option<u64> {
        let Op::Conv2d(c) = self else {
            return None;
        };
        let (window, positions) = conv_window_positions(c, inputs, output)?;
        if conv_chunk_rows(window, positions, 4) >= positions {
            return None;
        }
        let whole = (4 * positions * window) as u64;
        let mut extra = whole - conv_chunk_bytes(window, positions);
        // gemm packs the larger product's rows in blocks bounded by its cache blocking: about a
        // quarter of the larger windows, at most about 1 MiB more than for a chunk (measured
        // with the counting allocator on U-Net's and VGG16's convolutions: 0.04 to 0.8 MiB).
        extra += (extra / 4).min(WHOLE_SAMPLE_PACKING);
        if backward && masked {
            let opg = c.filters / c.groups.max(1);
            extra += (4 * positions * opg) as u64 - conv_masked_bytes(window, positions, opg);
        }
        Some(extra)
    }
}

/// Bytes of unfolded windows one matrix product of the executor's CPU convolution works on
/// (`checkmate_executor::conv_cpu`): the bound on a convolution's scratch.
pub const CONV_CHUNK_BYTES: usize = 1 << 20;

/// Output positions per chunk of the executor's CPU convolution for elements of `elem` bytes:
/// `clamp(CONV_CHUNK_BYTES / (elem * window), 1, positions)` (the kernel uses this formula too).
pub fn conv_chunk_rows(window: usize, positions: usize, elem: usize) -> usize {
    conv_chunk_rows_within(window, positions, elem, CONV_CHUNK_BYTES)
}

/// [`conv_chunk_rows`] for chunks of at most `chunk_bytes` (at least one position).
pub fn conv_chunk_rows_within(
    window: usize,
    positions: usize,
    elem: usize,
    chunk_bytes: usize,
) -> usize {
    (chunk_bytes / (elem.max(1) * window.max(1))).clamp(1, positions.max(1))
}

/// The masked upstream-gradient buffer of a convolution followed by ReLU, in f32 bytes:
/// `filters_per_group * rows` elements, `rows` from [`conv_chunk_rows`].
pub fn conv_masked_bytes(window: usize, positions: usize, filters_per_group: usize) -> u64 {
    (4 * conv_chunk_rows(window, positions, 4) * filters_per_group) as u64
}

/// The one chunk buffer of the executor's CPU convolution, in f32 bytes: `rows * window`
/// elements, `rows` from [`conv_chunk_rows`].
pub fn conv_chunk_bytes(window: usize, positions: usize) -> u64 {
    (4 * conv_chunk_rows(window, positions, 4) * window) as u64
}

/// A convolution's window columns per group (`cin / groups * kh * kw`) and output positions, for
/// NCHW input and output.
fn conv_window_positions(
    c: &Conv2d,
    inputs: &[TensorType],
    output: &Shape,
) -> Option<(usize, usize)> {
    let x = inputs
        .first()
        .filter(|x| x.shape.rank() == 4 && output.rank() == 4)?;
    Some((
        x.shape.dim(1) / c.groups.max(1) * c.kernel[0] * c.kernel[1],
        output.dim(2) * output.dim(3),
    ))
}
