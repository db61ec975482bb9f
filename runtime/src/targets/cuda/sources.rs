//! The CUDA C kernel files (`kernels/*.cu`, one per op family, mirroring
//! `cpu/kernels/`), compiled at run time by NVRTC. Each is compiled on its
//! own with the shared prelude `kernels/common.cuh` prepended; they include
//! no header, so NVRTC alone compiles them (CI compiles every one for
//! sm_80 and sm_90 without a GPU: `runtime/tests/it/cuda_ptx.rs`).

/// The prelude every file starts with.
pub const PRELUDE: &str = include_str!("kernels/common.cuh");

/// One kernel file.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelFile {
    /// The file name (`norm.cu`).
    pub name: &'static str,
    /// Its text, without the prelude.
    pub body: &'static str,
    /// The `extern "C"` kernels it defines (checked by the unit test below
    /// and looked up by name after loading).
    pub kernels: &'static [&'static str],
}

impl KernelFile {
    /// The text NVRTC compiles: the prelude, then the file.
    pub fn source(&self) -> String {
        format!("{PRELUDE}\n#line 1 \"{}\"\n{}", self.name, self.body)
    }
}

/// Element-wise ops, casts, dropout, the executor's buffer helpers.
pub const ELEMENTWISE: KernelFile = KernelFile {
    name: "elementwise.cu",
    body: include_str!("kernels/elementwise.cu"),
    kernels: &[
        "unary_f",
        "unary_i",
        "unary_grad",
        "binary_f",
        "binary_i",
        "compare",
        "logical",
        "logical_not",
        "where_",
        "cast",
        "dropout",
        "convert_div",
        "accumulate",
        "round_to",
    ],
};

/// Strided copies and fills.
pub const LAYOUT: KernelFile = KernelFile {
    name: "layout.cu",
    body: include_str!("kernels/layout.cu"),
    kernels: &["strided_copy", "fill"],
};

/// Reductions.
pub const REDUCE: KernelFile = KernelFile {
    name: "reduce.cu",
    body: include_str!("kernels/reduce.cu"),
    kernels: &[
        "reduce_to",
        "reduce_max_grad",
        "reduce_partial",
        "reduce_finish",
    ],
};

/// Layer norm and RMS norm.
pub const NORM: KernelFile = KernelFile {
    name: "norm.cu",
    body: include_str!("kernels/norm.cu"),
    kernels: &[
        "ln_fwd",
        "rms_fwd",
        "norm_bwd_dx",
        "norm_bwd_params_partial",
        "norm_bwd_params_finish",
    ],
};

/// Softmax and log-softmax.
pub const SOFTMAX: KernelFile = KernelFile {
    name: "softmax.cu",
    body: include_str!("kernels/softmax.cu"),
    kernels: &["softmax_fwd", "softmax_bwd"],
};

/// Fused causal attention.
pub const ATTENTION: KernelFile = KernelFile {
    name: "attention.cu",
    body: include_str!("kernels/attention.cu"),
    kernels: &["attn_fwd", "attn_bwd_dq", "attn_bwd_dkdv"],
};

/// Gather (embedding) and its gradient.
pub const GATHER: KernelFile = KernelFile {
    name: "gather.cu",
    body: include_str!("kernels/gather.cu"),
    kernels: &["gather_fwd", "gather_bwd"],
};

/// Cross-entropy.
pub const LOSS: KernelFile = KernelFile {
    name: "loss.cu",
    body: include_str!("kernels/loss.cu"),
    kernels: &["ce_rows", "ce_valid", "ce_finish", "ce_bwd"],
};

/// Vocabulary parallelism: the split embedding and the logits' statistics.
pub const VOCAB: KernelFile = KernelFile {
    name: "vocab.cu",
    body: include_str!("kernels/vocab.cu"),
    kernels: &[
        "vocab_lookup_fwd",
        "vocab_lookup_bwd",
        "vocab_stats",
        "vocab_stats_bwd",
    ],
};

/// 2-D convolution's im2col, col2im and bias.
pub const CONV: KernelFile = KernelFile {
    name: "conv.cu",
    body: include_str!("kernels/conv.cu"),
    kernels: &["conv_im2col", "conv_col2im", "conv_bias"],
};

/// Max and average pooling and their gradients.
pub const POOL: KernelFile = KernelFile {
    name: "pool.cu",
    body: include_str!("kernels/pool.cu"),
    kernels: &["maxpool_fwd", "maxpool_bwd", "avgpool_fwd", "avgpool_bwd"],
};

/// Optimizers and gradient clipping.
pub const OPTIM: KernelFile = KernelFile {
    name: "optim.cu",
    body: include_str!("kernels/optim.cu"),
    kernels: &["adamw", "sgd", "sumsq_partial", "sumsq_finish", "clip"],
};

/// Every kernel file.
pub const ALL: [KernelFile; 12] = [
    ELEMENTWISE,
    LAYOUT,
    REDUCE,
    NORM,
    SOFTMAX,
    ATTENTION,
    GATHER,
    LOSS,
    VOCAB,
    CONV,
    POOL,
    OPTIM,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_kernel_is_defined_in_its_file_and_every_definition_is_listed() {
        for f in ALL {
            let defined: Vec<&str> = f
                .body
                .split("extern \"C\" __global__ void ")
                .skip(1)
                .filter_map(|rest| rest.split('(').next())
                .collect();
            let mut listed: Vec<&str> = f.kernels.to_vec();
            let mut found = defined.clone();
            listed.sort_unstable();
            found.sort_unstable();
            assert_eq!(listed, found, "{}", f.name);
        }
    }
}
