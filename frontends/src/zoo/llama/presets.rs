//! The Llama-family presets.

use super::super::rope::{self, Rope};
use super::{Arch, LlamaConfig};

/// The Llama-family presets, named as users name them, with the sizes of
/// the Hugging Face `config.json` each is named after (`meta-llama/*`,
/// `Qwen/*`, `mistralai/Mistral-7B-v0.1` and `-v0.3`,
/// `microsoft/Phi-3-mini-4k-instruct` and `-medium-4k-instruct`). `seq` is
/// the configured context capped at 8192; `positions` keeps the full one.
pub(crate) fn presets() -> Vec<(&'static str, LlamaConfig)> {
    use Arch::*;
    let m = |arch, l, h, a, kv, f, v, ctx: usize, theta| {
        let mut c = LlamaConfig::preset(arch, l, h, a, kv, f, v, ctx.min(8192), theta);
        c.positions = ctx;
        c
    };
    let llama31 = |c: LlamaConfig, factor| LlamaConfig {
        rope: Rope {
            theta: 500_000.0,
            scaling: rope::Scaling::Llama3 {
                factor,
                low: 1.0,
                high: 4.0,
                original: 8192,
            },
        },
        positions: 131_072,
        ..c
    };
    let tied = |c: LlamaConfig| LlamaConfig { tie: true, ..c };
    let eps6 = |c: LlamaConfig| LlamaConfig { eps: 1e-6, ..c };
    let head_dim = |c: LlamaConfig, d| LlamaConfig { head_dim: d, ..c };
    let window = |c: LlamaConfig, w| LlamaConfig {
        window: Some(w),
        ..c
    };
    vec![
        (
            "llama-mini",
            // A small Llama for demos: grouped-query attention, vocabulary 1024.
            m(Llama, 2, 128, 4, 2, 344, 1024, 128, 10_000.0),
        ),
        (
            "llama2-7b",
            m(Llama, 32, 4096, 32, 32, 11008, 32000, 4096, 1e4),
        ),
        (
            "llama2-13b",
            m(Llama, 40, 5120, 40, 40, 13824, 32000, 4096, 1e4),
        ),
        (
            "llama2-70b",
            m(Llama, 80, 8192, 64, 8, 28672, 32000, 4096, 1e4),
        ),
        (
            "llama3-8b",
            m(Llama, 32, 4096, 32, 8, 14336, 128256, 8192, 5e5),
        ),
        (
            "llama3-70b",
            m(Llama, 80, 8192, 64, 8, 28672, 128256, 8192, 5e5),
        ),
        (
            "llama3.1-8b",
            llama31(m(Llama, 32, 4096, 32, 8, 14336, 128256, 8192, 5e5), 8.0),
        ),
        (
            "llama3.1-70b",
            llama31(m(Llama, 80, 8192, 64, 8, 28672, 128256, 8192, 5e5), 8.0),
        ),
        (
            "llama3.1-405b",
            llama31(m(Llama, 126, 16384, 128, 8, 53248, 128256, 8192, 5e5), 8.0),
        ),
        (
            "llama3.2-1b",
            tied(llama31(
                m(Llama, 16, 2048, 32, 8, 8192, 128256, 8192, 5e5),
                32.0,
            )),
        ),
        (
            "llama3.2-3b",
            tied(llama31(
                m(Llama, 28, 3072, 24, 8, 8192, 128256, 8192, 5e5),
                32.0,
            )),
        ),
        (
            "qwen2.5-0.5b",
            tied(eps6(m(Qwen2, 24, 896, 14, 2, 4864, 151936, 32768, 1e6))),
        ),
        (
            "qwen2.5-1.5b",
            tied(eps6(m(Qwen2, 28, 1536, 12, 2, 8960, 151936, 32768, 1e6))),
        ),
        (
            "qwen2.5-7b",
            eps6(m(Qwen2, 28, 3584, 28, 4, 18944, 152064, 32768, 1e6)),
        ),
        (
            "qwen2.5-14b",
            eps6(m(Qwen2, 48, 5120, 40, 8, 13824, 152064, 32768, 1e6)),
        ),
        (
            "qwen2.5-32b",
            eps6(m(Qwen2, 64, 5120, 40, 8, 27648, 152064, 32768, 1e6)),
        ),
        (
            "qwen2.5-72b",
            eps6(m(Qwen2, 80, 8192, 64, 8, 29568, 152064, 32768, 1e6)),
        ),
        (
            "qwen3-0.6b",
            tied(head_dim(
                eps6(m(Qwen3, 28, 1024, 16, 8, 3072, 151936, 40960, 1e6)),
                128,
            )),
        ),
        (
            "qwen3-8b",
            head_dim(
                eps6(m(Qwen3, 36, 4096, 32, 8, 12288, 151936, 40960, 1e6)),
                128,
            ),
        ),
        (
            "qwen3-32b",
            head_dim(
                eps6(m(Qwen3, 64, 5120, 64, 8, 25600, 151936, 40960, 1e6)),
                128,
            ),
        ),
        (
            "mistral-7b",
            window(m(Mistral, 32, 4096, 32, 8, 14336, 32000, 32768, 1e4), 4096),
        ),
        (
            "mistral-7b-v0.3",
            m(Mistral, 32, 4096, 32, 8, 14336, 32768, 32768, 1e6),
        ),
        (
            "phi3-mini",
            window(m(Phi3, 32, 3072, 32, 32, 8192, 32064, 4096, 1e4), 2047),
        ),
        (
            "phi3-medium",
            window(m(Phi3, 40, 5120, 40, 10, 17920, 32064, 4096, 1e4), 2047),
        ),
    ]
}
