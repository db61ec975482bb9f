//! The arithmetic of `Window2d`, shared by the convolution and pooling rules
//! and every backend's kernels: output lengths, the input rows a window
//! covers, and how many of its taps count.

use crate::op::Window2d;

/// The axes a window slides over, by name, for error messages.
const AXES: [&str; 2] = ["height", "width"];

impl Window2d {
    /// A window with no padding, stride 1 and no dilation.
    pub fn of_kernel(kernel: [usize; 2]) -> Window2d {
        Window2d {
            kernel,
            stride: [1, 1],
            dilation: [1, 1],
            pads: [0; 4],
            ceil_mode: false,
        }
    }

    /// Every kernel size, stride and dilation at least 1.
    pub fn check(&self) -> Result<(), String> {
        for (what, v) in [
            ("kernel", self.kernel),
            ("stride", self.stride),
            ("dilation", self.dilation),
        ] {
            if v.contains(&0) {
                return Err(format!("{what} {v:?} has a zero"));
            }
        }
        Ok(())
    }

    /// The input extent one window covers along `axis` (0: height, 1:
    /// width): `dilation · (kernel - 1) + 1`.
    pub fn span(&self, axis: usize) -> usize {
        self.dilation[axis] * (self.kernel[axis] - 1) + 1
    }

    /// Padding before and after the input along `axis`.
    pub fn pad(&self, axis: usize) -> (usize, usize) {
        (self.pads[axis], self.pads[axis + 2])
    }

    /// The output length along `axis` for an input of `len`, or why there
    /// is none (the window is larger than the padded input).
    pub fn out_len(&self, axis: usize, len: usize) -> Result<usize, String> {
        self.check()?;
        let (before, after) = self.pad(axis);
        let padded = len + before + after;
        let span = self.span(axis);
        if span > padded {
            return Err(format!(
                "the window spans {span} along {} (kernel {}, dilation {}) but the padded input \
                 has {padded} ({len} + pads {before} and {after})",
                AXES[axis], self.kernel[axis], self.dilation[axis]
            ));
        }
        let stride = self.stride[axis];
        let room = padded - span;
        if !self.ceil_mode {
            return Ok(room / stride + 1);
        }
        let mut out = room.div_ceil(stride) + 1;
        // The last window must start inside the input or its leading padding.
        if (out - 1) * stride >= len + before {
            out -= 1;
        }
        Ok(out)
    }

    /// The output's `[height, width]` for an input's.
    pub fn out_hw(&self, hw: [usize; 2]) -> Result<[usize; 2], String> {
        Ok([self.out_len(0, hw[0])?, self.out_len(1, hw[1])?])
    }

    /// The input position of tap `a` of output position `i` along `axis`
    /// (negative or past `len` in the padding).
    pub fn position(&self, axis: usize, i: usize, a: usize) -> isize {
        (i * self.stride[axis] + a * self.dilation[axis]) as isize - self.pads[axis] as isize
    }

    /// How many taps of output position `i` along `axis` count in an
    /// average over an input of `len`: those inside the input, or (with
    /// `include_pad`) inside the padded input.
    pub fn taps(&self, axis: usize, i: usize, len: usize, include_pad: bool) -> usize {
        let (before, after) = self.pad(axis);
        let (lo, hi) = if include_pad {
            (-(before as isize), (len + after) as isize)
        } else {
            (0, len as isize)
        };
        (0..self.kernel[axis])
            .filter(|&a| (lo..hi).contains(&self.position(axis, i, a)))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(kernel: usize, stride: usize, pad: usize, ceil_mode: bool) -> Window2d {
        Window2d {
            kernel: [kernel; 2],
            stride: [stride; 2],
            dilation: [1, 1],
            pads: [pad; 4],
            ceil_mode,
        }
    }

    /// PyTorch's output lengths: floor, ceil, and ceil less a window that
    /// would start in the trailing padding.
    #[test]
    fn output_lengths_follow_pytorch() {
        // torch.nn.MaxPool2d(3, 2, 1) on 112: 56 (ResNet's stem).
        assert_eq!(window(3, 2, 1, false).out_len(0, 112), Ok(56));
        // MaxPool2d(2, 2, ceil_mode=True) on 5: 3; floor: 2.
        assert_eq!(window(2, 2, 0, true).out_len(0, 5), Ok(3));
        assert_eq!(window(2, 2, 0, false).out_len(0, 5), Ok(2));
        // MaxPool2d(2, 2, padding=1, ceil_mode=True) on 4: ceil gives 4, but
        // the 4th window would start at 6 >= 4 + 1, so 3.
        assert_eq!(window(2, 2, 1, true).out_len(0, 4), Ok(3));
        // Conv2d(k=7, s=2, p=3) on 224: 112.
        assert_eq!(window(7, 2, 3, false).out_len(1, 224), Ok(112));
        let dilated = Window2d {
            dilation: [2, 2],
            ..window(3, 1, 0, false)
        };
        assert_eq!(dilated.span(0), 5);
        assert_eq!(dilated.out_len(0, 7), Ok(3));
    }

    #[test]
    fn a_window_larger_than_the_padded_input_is_an_error() {
        let err = window(5, 1, 1, false).out_len(1, 2).unwrap_err();
        assert!(err.contains("spans 5 along width"), "{err}");
        assert!(err.contains("padded input has 4"), "{err}");
        let zero = Window2d {
            stride: [0, 1],
            ..window(2, 1, 0, false)
        };
        assert!(zero.out_len(0, 4).unwrap_err().contains("stride"));
    }

    #[test]
    fn taps_count_the_padding_only_when_asked() {
        let w = window(3, 2, 1, true);
        // Position 0 covers -1..=1: 2 inside, 3 with the padding.
        assert_eq!(w.taps(0, 0, 5, false), 2);
        assert_eq!(w.taps(0, 0, 5, true), 3);
        // Position 2 covers 3..=5 of 5 (+1 pad): 2 inside, 3 padded.
        assert_eq!(w.taps(0, 2, 5, false), 2);
        assert_eq!(w.taps(0, 2, 5, true), 3);
        // A ceil-mode window past the padding: 6..=8 of len 6 + pad 1.
        let c = window(3, 3, 1, true);
        assert_eq!(c.out_len(0, 6), Ok(3));
        assert_eq!(c.taps(0, 2, 6, true), 2);
    }
}
