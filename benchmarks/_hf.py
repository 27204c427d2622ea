"""Helper for the benchmarks (not a benchmark: ``make bench`` skips files starting with ``_``).

``hf_copy(model)``: Hugging Face ``transformers``' ``GPT2LMHeadModel`` holding the same weights
as a tinygpt ``GPT`` in GPT-2's layout (``tinygpt.gpt2.to_hf_state_dict``), so that a benchmark
times the two on identical models.
"""

from __future__ import annotations

from tinygpt.gpt2 import to_hf_state_dict
from tinygpt.model import GPT


def hf_copy(model: GPT):
    """A ``GPT2LMHeadModel`` (eval mode) with ``model``'s weights; None without transformers."""
    try:
        import transformers
    except ImportError:
        return None
    transformers.logging.set_verbosity_error()
    c = model.config
    hc = transformers.GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer,
        n_head=c.n_head, n_inner=c.mlp_width, layer_norm_epsilon=c.norm_eps,
        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        tie_word_embeddings=c.tie_weights, bos_token_id=0, eos_token_id=0)
    hf = transformers.GPT2LMHeadModel(hc).eval()
    hf.load_state_dict(to_hf_state_dict(model), strict=True)
    return hf
