//! 2-D convolution: `Conv (x[n, c, h, w], w[o, c / groups, kh, kw][, b[o]])`
//! and its gradient kernels `ConvGradInput (w, dy) -> dx` and
//! `ConvGradWeight (x, dy) -> dw`; the bias's gradient is `dy` summed over
//! the batch and both spatial axes. A forward, input-gradient and
//! weight-gradient kernel each count `2 · n · o · oh · ow · (c / groups) ·
//! kh · kw` FLOPs (the products of im2col's matrix multiply).

use super::check::{float, same_dtype};
use super::vjp::not_differentiable;
use super::{misrouted, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::{Op, ReduceFn, Window2d};
use crate::types::{Shape, TensorType};

pub(crate) struct Conv;

impl Family for Conv {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        match op {
            Op::Conv { window, groups } => {
                if !(2..=3).contains(&inputs.len()) {
                    return Err(format!(
                        "expects 2 or 3 inputs (x, w[, b]), got {}",
                        inputs.len()
                    ));
                }
                let (x, w) = (inputs[0], inputs[1]);
                let [n, _, h, wd] = image(x, "x")?;
                let o = weight(w, x, window, *groups)?;
                if let Some(b) = inputs.get(2) {
                    same_dtype(x, b, "x and b")?;
                    if b.shape.dims() != [o] {
                        return Err(format!("b must have shape [{o}] (w's outputs), got {b}"));
                    }
                }
                let [oh, ow] = window.out_hw([h, wd])?;
                Ok(vec![typed(x, [n, o, oh, ow])])
            }
            Op::ConvGradInput {
                window,
                groups,
                input_hw,
            } => {
                arity2(inputs, "w, dy")?;
                let (w, dy) = (inputs[0], inputs[1]);
                let [n, o, oh, ow] = image(dy, "dy")?;
                let dims = rank4(w, "w")?;
                let c = dims[1] * groups;
                let x = typed(dy, [n, c, input_hw[0], input_hw[1]]);
                if weight(w, &x, window, *groups)? != o {
                    return Err(format!(
                        "dy {dy} has {o} channels but w {w} has {}",
                        dims[0]
                    ));
                }
                matches_output(window, *input_hw, [oh, ow], dy)?;
                Ok(vec![x])
            }
            Op::ConvGradWeight { window, groups } => {
                arity2(inputs, "x, dy")?;
                let (x, dy) = (inputs[0], inputs[1]);
                let [n, c, h, wd] = image(x, "x")?;
                let [dn, o, oh, ow] = image(dy, "dy")?;
                same_dtype(x, dy, "x and dy")?;
                if dn != n {
                    return Err(format!("x {x} and dy {dy} have different batches"));
                }
                channels(c, o, *groups)?;
                matches_output(window, [h, wd], [oh, ow], dy)?;
                let [kh, kw] = window.kernel;
                Ok(vec![typed(x, [o, c / groups, kh, kw])])
            }
            _ => Err(misrouted(op, "convolution")),
        }
    }

    fn vjp(&self, op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        let Op::Conv { window, groups } = op else {
            return Err(not_differentiable(op));
        };
        let (x, w, dy) = (cx.x(0)?, cx.x(1)?, cx.dy());
        let (window, groups) = (*window, *groups);
        let dx = if cx.needs(0) {
            let xs = cx.shape(x)?;
            let input_hw = [xs[2], xs[3]];
            let op = Op::ConvGradInput {
                window,
                groups,
                input_hw,
            };
            Some(cx.emit(op, &[w, dy])?)
        } else {
            None
        };
        let dw = if cx.needs(1) {
            Some(cx.emit(Op::ConvGradWeight { window, groups }, &[x, dy])?)
        } else {
            None
        };
        let db = if cx.needs(2) {
            let sum = Op::Reduce {
                f: ReduceFn::Sum,
                axes: vec![0, 2, 3],
                keepdims: false,
            };
            Some(cx.emit(sum, &[dy])?)
        } else {
            None
        };
        Ok(vec![dx, dw, db])
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], outputs: &[TensorType]) -> f64 {
        // Every kernel multiplies the output's (or dy's) elements by one
        // group's taps: `(c / groups) · kh · kw`.
        let (y, taps) = match op {
            Op::Conv { .. } => (outputs.first(), inputs.get(1).map(|w| w.shape.dims())),
            Op::ConvGradInput { .. } => (
                inputs.get(1).copied(),
                inputs.first().map(|w| w.shape.dims()),
            ),
            Op::ConvGradWeight { .. } => (
                inputs.get(1).copied(),
                outputs.first().map(|w| w.shape.dims()),
            ),
            _ => return 0.0,
        };
        let taps: f64 = taps.map_or(0.0, |w| w.iter().skip(1).product::<usize>() as f64);
        2.0 * y.map_or(0.0, |y| y.numel() as f64) * taps
    }
}

/// Exactly two inputs.
fn arity2(inputs: &[&TensorType], what: &str) -> Result<(), String> {
    super::check::arity(inputs, 2, what)
}

/// The dims of a rank-4 tensor.
fn rank4(t: &TensorType, what: &str) -> Result<[usize; 4], String> {
    <[usize; 4]>::try_from(t.shape.dims()).map_err(|_| {
        format!(
            "{what} must be [n, c, h, w] (rank 4: only 2-D convolutions and pooling are \
             supported), got {t}"
        )
    })
}

/// A floating-point `[n, c, h, w]` tensor's dims.
pub(crate) fn image(t: &TensorType, what: &str) -> Result<[usize; 4], String> {
    float(t, what)?;
    rank4(t, what)
}

/// `t`'s dtype with `dims`.
pub(crate) fn typed(t: &TensorType, dims: [usize; 4]) -> TensorType {
    TensorType {
        dtype: t.dtype,
        shape: Shape(dims.to_vec()),
    }
}

/// `c` input and `o` output channels split into `groups`.
fn channels(c: usize, o: usize, groups: usize) -> Result<(), String> {
    if groups == 0 || !c.is_multiple_of(groups) || !o.is_multiple_of(groups) {
        return Err(format!(
            "groups {groups} must divide the input channels {c} and the output channels {o}"
        ));
    }
    Ok(())
}

/// Checks a weight against the input it convolves; its output channels.
fn weight(
    w: &TensorType,
    x: &TensorType,
    window: &Window2d,
    groups: usize,
) -> Result<usize, String> {
    let [o, cg, kh, kw] = rank4(w, "w")?;
    same_dtype(x, w, "x and w")?;
    let c = x.shape.dims()[1];
    channels(c, o, groups)?;
    if cg != c / groups {
        return Err(format!(
            "w {w} must have {} input channels per group (x {x} has {c} in {groups} group{}), \
             got {cg}",
            c / groups,
            if groups == 1 { "" } else { "s" }
        ));
    }
    if [kh, kw] != window.kernel {
        return Err(format!(
            "w {w} has a {kh}x{kw} kernel but the op's is {:?}",
            window.kernel
        ));
    }
    if window.ceil_mode {
        return Err("a convolution has no ceil_mode".into());
    }
    Ok(o)
}

/// `dy`'s spatial size is the window's output over `input_hw`.
pub(crate) fn matches_output(
    window: &Window2d,
    input_hw: [usize; 2],
    out_hw: [usize; 2],
    dy: &TensorType,
) -> Result<(), String> {
    let want = window.out_hw(input_hw)?;
    if want != out_hw {
        return Err(format!(
            "dy {dy} must be {want:?} spatially (the window over an input of {input_hw:?})"
        ));
    }
    Ok(())
}

/// The sizes one convolution kernel works on, read from its operands: the
/// planner sizes the kernel's scratch and matrix products from it and every
/// backend's kernels loop over it. Each group of `images_per_product`
/// images is one matrix product over their im2col matrix of `taps x images
/// · pixels` (`taps = c / groups · kh · kw`, `pixels = oh · ow`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub n: usize,
    pub c: usize,
    pub hw: [usize; 2],
    pub o: usize,
    pub out_hw: [usize; 2],
    pub groups: usize,
    pub window: Window2d,
}

impl Geometry {
    /// The geometry of a `Conv`, `ConvGradInput` or `ConvGradWeight` on
    /// operands of these dims, or `None` for any other op or operands the
    /// shape rules reject.
    pub fn of(op: &Op, dims: &[&[usize]]) -> Option<Geometry> {
        let four = |i: usize| -> Option<[usize; 4]> { dims.get(i)?.to_vec().try_into().ok() };
        let (window, groups) = match op {
            Op::Conv { window, groups }
            | Op::ConvGradInput { window, groups, .. }
            | Op::ConvGradWeight { window, groups } => (*window, *groups),
            _ => return None,
        };
        let g = match op {
            Op::Conv { .. } => {
                let ([n, c, h, w], [o, ..]) = (four(0)?, four(1)?);
                let out_hw = window.out_hw([h, w]).ok()?;
                Geometry {
                    n,
                    c,
                    hw: [h, w],
                    o,
                    out_hw,
                    groups,
                    window,
                }
            }
            Op::ConvGradInput { input_hw, .. } => {
                let ([o, cg, ..], [n, _, oh, ow]) = (four(0)?, four(1)?);
                Geometry {
                    n,
                    c: cg * groups,
                    hw: *input_hw,
                    o,
                    out_hw: [oh, ow],
                    groups,
                    window,
                }
            }
            _ => {
                let ([n, c, h, w], [_, o, oh, ow]) = (four(0)?, four(1)?);
                Geometry {
                    n,
                    c,
                    hw: [h, w],
                    o,
                    out_hw: [oh, ow],
                    groups,
                    window,
                }
            }
        };
        (groups > 0 && g.c.is_multiple_of(groups) && g.o.is_multiple_of(groups)).then_some(g)
    }

    /// Input channels per group.
    pub fn group_in(&self) -> usize {
        self.c / self.groups
    }

    /// Output channels per group.
    pub fn group_out(&self) -> usize {
        self.o / self.groups
    }

    /// Rows of the im2col matrix: one group's input channels times the
    /// kernel's taps.
    pub fn taps(&self) -> usize {
        self.group_in() * self.window.kernel[0] * self.window.kernel[1]
    }

    /// Output positions of one image.
    pub fn pixels(&self) -> usize {
        self.out_hw[0] * self.out_hw[1]
    }

    /// A 1x1 kernel with stride 1 and no padding: the input is its own
    /// im2col matrix.
    pub fn pointwise(&self) -> bool {
        self.window.kernel == [1, 1] && self.window.stride == [1, 1] && self.window.pads == [0; 4]
    }

    /// Images one matrix product covers: enough that it has at least
    /// `COLUMNS` columns (`images · pixels`), so small late-stage outputs
    /// (a ResNet's 2x2 and 1x1 maps) still give the matrix library wide
    /// products; one where an image alone has that many.
    pub fn images_per_product(&self) -> usize {
        const COLUMNS: usize = 64;
        let pix = self.pixels().max(1);
        if pix >= COLUMNS {
            1
        } else {
            COLUMNS.div_ceil(pix).min(self.n).max(1)
        }
    }

    /// f32 elements of the kernels' scratch: for one image per product, one
    /// im2col matrix (none for a pointwise convolution); for several, their
    /// im2col matrix (`taps x images · pixels`) and their output's (or
    /// `dy`'s) matrix (`group_out x images · pixels`), gathered from and
    /// scattered to the images' planes.
    pub fn scratch(&self) -> usize {
        let b = self.images_per_product();
        if b > 1 {
            (self.taps() + self.group_out()) * b * self.pixels()
        } else if self.pointwise() {
            0
        } else {
            self.taps() * self.pixels()
        }
    }
}
