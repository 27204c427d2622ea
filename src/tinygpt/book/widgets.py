"""An interactive sampling form for JupyterLab: ipywidgets controls around ``generate``.

Chapter 9 builds the form and shows its click handler (``SamplingWidget.run``).

``sampling_widget(model, tokenizer)`` builds the form (prompt, temperature, top-k with 0 = off,
top-p with 1 = off, new tokens, seed, a *Generate* button) and an output area. A click calls
``tinygpt.sample.generate`` with a generator seeded by the seed shown, so it is reproducible; a
bad setting shows the library's error message there, not a traceback. It needs ``ipywidgets``
(``pip install 'tinygpt[book]'``), imported only when a form is built, and a live kernel.
"""

from __future__ import annotations

import html
from typing import Any

import torch

from tinygpt.model import GPT
from tinygpt.sample import generate
from tinygpt.tokenizer import Tokenizer

__all__ = ["SamplingWidget", "sampling_widget"]


def _ipywidgets() -> Any:
    try:
        import ipywidgets
    except ImportError as err:
        raise ImportError("tinygpt.book.widgets needs ipywidgets: pip install ipywidgets (it is in "
                          "tinygpt's 'book' extra: pip install 'tinygpt[book]')") from err
    return ipywidgets


class SamplingWidget:
    """The form built by ``sampling_widget``: its controls, the output area and the last text.

    Attributes: ``prompt``, ``temperature``, ``top_k``, ``top_p``, ``length``, ``seed`` (the
    controls), ``button``, ``output`` (an ``HTML`` widget), ``box`` (the whole form), ``text``
    (the last generated text, prompt included, or the last error message) and ``error`` (whether
    the last click failed). Displaying the object displays ``box``.
    """

    def __init__(self, model: GPT, tokenizer: Tokenizer, prompt: str, temperature: float,
                 top_k: int | None, top_p: float | None, max_new_tokens: int, seed: int) -> None:
        w = _ipywidgets()
        self.model, self.tokenizer = model, tokenizer
        V = model.config.vocab_size
        wide = {"style": {"description_width": "9em"}, "layout": w.Layout(width="32em")}
        self.prompt = w.Textarea(value=prompt, description="prompt", rows=2, **wide)
        self.temperature = w.FloatSlider(value=temperature, min=0.0, step=0.05,
                                         max=max(2.0, temperature), description="temperature",
                                         **wide)
        self.top_k = w.IntSlider(value=top_k or 0, min=0, max=V, description="top-k (0 = off)",
                                 **wide)
        self.top_p = w.FloatSlider(value=1.0 if top_p is None else top_p, min=0.0, max=1.0,
                                   step=0.01, description="top-p (1 = off)", **wide)
        self.length = w.IntSlider(value=max_new_tokens, min=1, max=max(1000, max_new_tokens),
                                  description="new tokens",
                                  **wide)
        self.seed = w.IntText(value=seed, description="seed", **wide)
        self.button = w.Button(description="Generate", button_style="primary")
        self.output = w.HTML(value="")
        self.box = w.VBox([self.prompt, self.temperature, self.top_k, self.top_p, self.length,
                           self.seed, self.button, self.output])
        self.text, self.error = "", False
        self.button.on_click(self._on_click)

    def settings(self) -> dict[str, Any]:
        """The keyword arguments of ``generate`` that the controls show (no generator)."""
        return {"max_new_tokens": self.length.value, "temperature": self.temperature.value,
                "top_k": self.top_k.value or None,
                "top_p": None if self.top_p.value == 1.0 else self.top_p.value}

    def run(self) -> str:
        """Generate with the current settings, show the result (or the error) and return it."""
        try:
            ids = self.tokenizer.encode(self.prompt.value)
            device = next(self.model.parameters()).device
            idx = torch.tensor([ids], dtype=torch.long, device=device)  # (1, T)
            gen = torch.Generator(device=device).manual_seed(int(self.seed.value))
            out = generate(self.model, idx, generator=gen, **self.settings())  # (1, T + n)
            new = self.tokenizer.decode(out[0, len(ids):].tolist())
        except (ValueError, TypeError, RuntimeError) as err:
            self.text, self.error = f"{type(err).__name__}: {err}", True
            self.output.value = (f'<pre style="color: #b00020; white-space: pre-wrap">'
                                 f"{html.escape(self.text)}</pre>")
            return self.text
        self.text, self.error = self.prompt.value + new, False
        self.output.value = (f'<pre style="white-space: pre-wrap"><b>'
                             f"{html.escape(self.prompt.value)}</b>{html.escape(new)}</pre>")
        return self.text

    def _on_click(self, _button: Any) -> None:
        self.button.disabled = True
        try:
            self.run()
        finally:
            self.button.disabled = False

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.box._repr_mimebundle_(**kwargs)


def sampling_widget(model: GPT, tokenizer: Tokenizer, prompt: str = "\n", *,
                    temperature: float = 0.8, top_k: int | None = None, top_p: float | None = None,
                    max_new_tokens: int = 200, seed: int = 0) -> SamplingWidget:
    """An interactive form that samples from ``model``; display it in JupyterLab.

    ``tokenizer``: anything with ``encode(str) -> list[int]`` and ``decode(list[int]) -> str``
    for the model's vocabulary (``tinygpt.tokenizer.CharTokenizer``, ``BPETokenizer``). The
    keyword arguments set the controls' starting values; a click runs
    ``generate(model, idx, max_new_tokens, temperature, top_k, top_p,
    generator=torch.Generator().manual_seed(seed))``. Raises ``ImportError`` without ipywidgets.
    """
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a tinygpt GPT, got {type(model).__name__}")
    if not (callable(getattr(tokenizer, "encode", None))
            and callable(getattr(tokenizer, "decode", None))):
        raise TypeError(f"tokenizer must have encode and decode methods, got "
                        f"{type(tokenizer).__name__}")
    return SamplingWidget(model, tokenizer, prompt, temperature, top_k, top_p, max_new_tokens,
                          seed)
