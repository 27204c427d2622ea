"""The book's diagrams (tinygpt.figures.drawing and the diagrams* modules) show what the code
computes.

Each figure is a valid SVG whose alt text is its title and aria-label; its text is dark ink in
colours that the palette keeps legible (text on light fills, lines readable on both themes'
backgrounds); the shapes and numbers drawn are those of real modules, so changing the config
changes the text. Values are compared with references computed here by other means.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.figures import attention_diagrams, drawing, embedding_diagrams, gpt_diagrams
from tinygpt.model import GPT, parameter_counts
from tinygpt.tokenizer import BPETokenizer
from tinygpt.train import lr_at

SVG = "{http://www.w3.org/2000/svg}"
SMALL = GPTConfig(vocab_size=70, block_size=16, n_layer=2, n_head=4, n_embd=32)
TRAIN = TrainConfig(batch_size=4, max_iters=300, warmup_iters=30, learning_rate=3e-3,
                    min_lr=3e-4)
TEXT = "the cat sat on the mat; then the other cat sat there, and thereafter the hat. " * 20


@pytest.fixture(scope="module")
def tokenizer() -> BPETokenizer:
    return BPETokenizer.train(TEXT, vocab_size=300)


def root(diagram: drawing.Diagram) -> ET.Element:
    return ET.fromstring(diagram.svg.split(drawing.MARK)[-1].strip())


def ids(diagram: drawing.Diagram) -> set[str]:
    return {e.get("id") for e in root(diagram).iter() if e.get("id")}


def all_figures(tokenizer):
    return {
        "bpe_tree": embedding_diagrams.bpe_tree(tokenizer, " thereafter"),
        "text_to_tokens": embedding_diagrams.text_to_tokens(tokenizer, "the café"),
        "embedding_sum": embedding_diagrams.embedding_sum(SMALL, [1, 2, 3]),
        "attention_flow": attention_diagrams.attention_flow(),
        "causal_mask_grid": attention_diagrams.causal_mask_grid(),
        "multi_head": attention_diagrams.multi_head(SMALL, T=5),
        "kv_cache_steps": attention_diagrams.kv_cache_steps(SMALL),
        "block_pre_post": gpt_diagrams.block_pre_post(SMALL),
        "gpt_stack": gpt_diagrams.gpt_stack(SMALL),
        "parameter_share": gpt_diagrams.parameter_share(SMALL),
        "training_loop": gpt_diagrams.training_loop(SMALL, TRAIN),
        "lr_schedule": gpt_diagrams.lr_schedule(TRAIN),
        "data_parallel": gpt_diagrams.data_parallel_step(SMALL, TRAIN),
    }


def test_every_figure_is_an_svg_with_alt_text_and_legible_colours(tokenizer):
    figures = all_figures(tokenizer)
    assert len(figures) == 13
    for name, figure in figures.items():
        svg = root(figure)
        assert svg.tag == f"{SVG}svg", name
        assert svg.get("role") == "img" and svg.get("aria-label") == figure.alt, name
        assert svg.find(f"{SVG}title").text == figure.alt, name
        assert len(figure.alt.split()) >= 10, (name, figure.alt)
        assert figure.texts(), name
        # text stays text (svg.fonttype none), always in the dark ink
        colours = set(re.findall(r"<text[^>]*style=\"[^\"]*fill: (#[0-9a-f]{6})", figure.svg))
        assert colours <= {drawing.INK}, (name, colours)
        assert figure._repr_svg_() == figure.svg
        # no opaque page behind the figure: the theme's own background shows
        assert 'style="fill: #ffffff"' not in figure.svg.split("<g id=\"axes_1\">")[0], name


def test_the_palette_reads_on_both_themes():
    for fill in [*drawing.FILLS.values(), drawing.STICKER]:
        assert drawing.contrast(drawing.INK, fill) >= 7, fill  # WCAG AAA for the text
    for background in drawing.BACKGROUNDS.values():
        assert drawing.contrast(drawing.LINE, background) >= 3, background  # graphics: 3:1
    assert drawing.contrast("#000000", "#ffffff") == pytest.approx(21)


def test_drawing_is_deterministic():
    assert gpt_diagrams.gpt_stack(SMALL).svg == gpt_diagrams.gpt_stack(SMALL).svg


def test_the_gpt_stack_shows_the_shapes_of_the_config():
    texts = " ".join(gpt_diagrams.gpt_stack(SMALL, T=12, batch=3).texts())
    assert "(B, T) = (3, 12)" in texts
    assert "(B, T, C) = (3, 12, 32)" in texts and "(B, T, V) = (3, 12, 70)" in texts
    wider = replace(SMALL, n_embd=48, vocab_size=99, n_layer=6)
    figure = gpt_diagrams.gpt_stack(wider, T=12, batch=3)
    texts = " ".join(figure.texts())
    assert "(3, 12, 48)" in texts and "(3, 12, 99)" in texts and "(3, 12, 32)" not in texts
    assert "blocks h.2 … h.4" in texts and "block h.5" in texts and "block h.3" not in texts
    assert "6 blocks" in figure.alt


def test_embedding_sum_shows_the_tables_and_the_stream():
    texts = " ".join(embedding_diagrams.embedding_sum(SMALL, [5, 6, 7, 8]).texts())
    assert "(V, C) = (70, 32)" in texts and "(T_max, C) = (16, 32)" in texts
    assert "(B, T, C) = (1, 4, 32)" in texts and "(T, C) = (4, 32)" in texts
    sinusoidal = replace(SMALL, positional="sinusoidal", n_embd=64)
    texts = " ".join(embedding_diagrams.embedding_sum(sinusoidal, [5, 6]).texts())
    assert "sinusoids" in texts and "(B, T, C) = (1, 2, 64)" in texts


def test_multi_head_and_the_kv_cache_show_head_shapes():
    texts = " ".join(attention_diagrams.multi_head(SMALL, T=5).texts())
    assert "H = 4" in texts and "(B, H, T, d_k) = (1, 4, 5, 8)" in texts
    assert "(B, T, 3C) = (1, 5, 96)" in texts
    texts = " ".join(attention_diagrams.multi_head(replace(SMALL, n_head=2), T=5).texts())
    assert "(B, H, T, d_k) = (1, 2, 5, 16)" in texts and "H = 2" in texts
    kv = attention_diagrams.kv_cache_steps(SMALL, steps=4)
    for t in range(1, 5):
        assert f"(B, H, t, d_k) = (1, 4, {t}, 8)" in " ".join(kv.texts())


def test_attention_flow_draws_the_layer_s_own_numbers():
    ex = attention_diagrams.attention_example(n_embd=4, T=4, seed=3)
    q, k, v = ex["q"], ex["k"], ex["v"]
    reference = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
    torch.testing.assert_close(ex["y"], reference, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ex["weights"].sum(-1), torch.ones(4))
    figure = attention_diagrams.attention_flow(seed=3)
    texts = figure.texts()
    for j in range(4):
        assert f"{float(ex['weights'][3, j]):.3f}" in texts
        assert f"{float(ex['scores'][3, j]):+.3f}" in texts
    assert attention_diagrams.attention_flow(seed=4).texts() != texts


def test_the_causal_mask_grid_is_the_mask():
    figure = attention_diagrams.causal_mask_grid(T=5)
    cells = {i for i in ids(figure) if i.startswith("cell:")}
    assert cells == {f"cell:{i}:{j}:{'on' if j <= i else 'off'}" for i in range(5)
                     for j in range(5)}
    assert figure.texts().count("masked") == 10


def test_the_bpe_tree_is_built_from_the_merges(tokenizer):
    word = " thereafter"
    figure = embedding_diagrams.bpe_tree(tokenizer, word)
    drawn = {int(i.split(":")[1]) for i in ids(figure) if i.startswith("token:")}
    assert set(tokenizer.encode_ordinary(word)) <= drawn
    for token in drawn:  # every merged token is drawn with both of its parts
        if token >= 256:
            assert set(tokenizer.merges[token - 256]) <= drawn
            assert f"#{token - 256}" in figure.texts()
    assert {t for t in drawn if t < 256} == set(word.encode())


def test_text_to_tokens_shows_bytes_and_ids(tokenizer):
    figure = embedding_diagrams.text_to_tokens(tokenizer, "the café")
    texts = figure.texts()
    for b in "the café".encode():
        assert str(b) in texts
    assert "195" in texts and "169" in texts  # é is two bytes
    for token in tokenizer.encode_ordinary("the café"):
        assert any(t.endswith(f"\n{token}") or t.split()[-1] == str(token) for t in texts)


def test_parameter_share_counts_the_model():
    figure = gpt_diagrams.parameter_share(SMALL)
    total = sum(p.numel() for p in GPT(SMALL).parameters())
    texts = " ".join(figure.texts())
    assert f"{total:,} parameters" in texts
    for name, n in parameter_counts(SMALL).items():
        if n:
            assert f"{n:,}  ({100 * n / total:.1f}%)" in texts, name


def test_training_figures_follow_their_configs():
    texts = " ".join(gpt_diagrams.training_loop(SMALL, TRAIN).texts())
    assert "(B, T) = (4, 16)" in texts and "(B, T, V) = (4, 16, 70)" in texts
    assert "max_iters = 300" in texts
    schedule = gpt_diagrams.lr_schedule(TRAIN)
    assert "0.003" in schedule.alt and "30 steps" in schedule.alt
    assert max(lr_at(s, TRAIN) for s in range(TRAIN.max_iters)) == pytest.approx(0.003)
    other = gpt_diagrams.lr_schedule(replace(TRAIN, warmup_iters=50))
    assert "50 steps" in other.alt and other.svg != schedule.svg


def test_data_parallel_buckets_hold_every_gradient():
    model = GPT(SMALL)
    buckets = gpt_diagrams.gradient_buckets(model, cap_mb=0.01)
    assert sum(buckets) == sum(p.numel() * p.element_size() for p in model.parameters())
    assert all(p.grad is None for p in model.parameters())  # the model is left as it was
    # reference: DDP's rule on the order in which backward finishes the gradients, found here
    # from the last gradient each parameter receives (a tied one receives two)
    last, clock = {}, iter(range(10**6))
    for p in model.parameters():
        p.register_hook(lambda g, p=p: last.__setitem__(p, next(clock)))
    x = torch.zeros(1, 8, dtype=torch.long)
    model(x, x)[1].backward()
    order = sorted(last, key=last.get)
    expected, size, limit = [], 0, int(0.01 * 2**20)
    for p in order:
        size += p.nbytes
        if size >= limit:
            expected, size = expected + [size], 0
    expected += [size] if size else []
    assert buckets == expected and len(buckets) > 1
    figure = gpt_diagrams.data_parallel_step(SMALL, TRAIN, world_size=3)
    texts = " ".join(figure.texts())
    assert all(f"process (rank) {r}" in texts for r in range(3))
    assert "3 × 4 = 12 windows" in texts


def test_bad_input_is_a_clear_error(tokenizer, tmp_path):
    with pytest.raises(TypeError, match="tokenizer"):
        embedding_diagrams.bpe_tree("not a tokenizer", "word")
    with pytest.raises(ValueError, match="14 characters"):
        embedding_diagrams.bpe_tree(tokenizer, "x" * 30)
    with pytest.raises(ValueError, match="T"):
        attention_diagrams.multi_head(SMALL, T=SMALL.block_size + 1)
    with pytest.raises(TypeError, match="config"):
        gpt_diagrams.gpt_stack({"n_layer": 2})
    with pytest.raises(ValueError, match="dims"):
        embedding_diagrams.shape_of((1, 2), "B T C")
    canvas = drawing.Canvas(1, 1)
    with pytest.raises(ValueError, match="fill='none'"):
        canvas.box(0.5, 0.5, 0.2, 0.2, "lost", fill="none")
    with pytest.raises(ValueError, match="alt text"):
        canvas.finish("a box")


def test_save_never_replaces_a_file_it_did_not_write(tmp_path):
    figure = attention_diagrams.causal_mask_grid(T=3)
    path = figure.save(tmp_path / "mask.svg")
    assert path.read_text() == figure.svg
    assert figure.save(path) == path  # its own drawing: replaced
    foreign = tmp_path / "notes.svg"
    foreign.write_text("<svg>mine</svg>")
    with pytest.raises(FileExistsError, match="not drawn by tinygpt"):
        figure.save(foreign)
    assert foreign.read_text() == "<svg>mine</svg>"
    with pytest.raises(ValueError, match=r"\.svg"):
        figure.save(tmp_path / "mask.png")
    assert not math.isnan(drawing.contrast(drawing.INK, drawing.LINE))


def diagram_cells() -> list[tuple[str, dict, str]]:
    """(chapter, the cell, the chapter's markdown) of every chapter's diagram cell."""
    import json
    from pathlib import Path

    found = []
    for path in sorted((Path(__file__).parents[1] / "chapters").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        found += [(path.stem, c, markdown) for c in cells if c["cell_type"] == "code"
                  and "figure" in c.get("metadata", {}).get("mystnb", {})]
    return found


def test_every_chapter_diagram_is_a_numbered_figure_with_alt_text_that_the_text_cites():
    cells = diagram_cells()
    chapters = {chapter for chapter, _, _ in cells}
    assert {"01_tokens", "04_embeddings", "05_attention", "06_block", "07_gpt",
            "08_training", "10_scaling"} <= chapters
    names = []
    for chapter, cell, markdown in cells:
        meta = cell["metadata"]["mystnb"]
        name, caption = meta["figure"]["name"], meta["figure"]["caption"]
        names.append(name)
        assert name.startswith("fig-") and len(caption.split()) >= 8, (chapter, name)
        assert len(meta["image"]["alt"].split()) >= 10, (chapter, name, "alt text")
        assert f"{{numref}}`{name}`" in markdown, (chapter, name, "never referred to")
        svgs = [o["data"]["image/svg+xml"] for o in cell.get("outputs", [])
                if "image/svg+xml" in o.get("data", {})]
        assert len(svgs) == 1, (chapter, name, "the executed cell shows one SVG")
        svg = "".join(svgs[0])
        assert drawing.MARK in svg and 'role="img"' in svg, (chapter, name)
    assert len(names) == len(set(names)) >= 13
