"""python -m train.explore: the HTML file, checked in a real (headless) browser.

The browser test needs Chromium from the system's packages and Playwright's
Python package pointed at it (no browser download): `.ci/run` installs both.
Without them it skips and says why.
"""
import base64
import os
import re
import shutil

import numpy as np
import pytest

import tinyattn as ta
from tinyattn.models import GPT, GPTConfig
from train import checkpoint, explore
from train.data import CharTokenizer, WordTokenizer, tokenizer_to_json

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
TEXT = "the cat sat on the mat."


def save_model(folder, tokenizer, n_layer=2, n_head=3, block_size=32):
    ta.manual_seed(0)
    model = GPT(GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=12 * n_head, block_size=block_size,
                          vocab_size=tokenizer.vocab_size))
    optimizer = model.configure_optimizer(0.1, 1e-3, (0.9, 0.99))
    checkpoint.save(os.path.join(folder, "ckpt.npz"), model, optimizer,
                    dict(config=model.config.to_dict(), tokenizer=tokenizer_to_json(tokenizer)))
    return model


@pytest.fixture(scope="module")
def char_page(tmp_path_factory):
    folder = tmp_path_factory.mktemp("explore")
    tok = CharTokenizer.from_text(TEXT)
    model = save_model(str(folder), tok)
    out = folder / "page.html"
    assert explore.main(["--out_dir", str(folder), "--text", TEXT, "--out", str(out)]) == 0
    return out, explore.attention_weights(model.eval(), tok.encode(TEXT))


def test_the_page_is_one_self_contained_file(char_page):
    path, weights = char_page
    text = path.read_text()
    assert "<script>" in text and "<style>" in text
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|https?://|@import|url\(", text)
    L, H, T, _ = weights.shape
    assert (L, H, T) == (2, 3, len(TEXT)) and np.allclose(weights.sum(-1), 1, atol=1e-5)
    packed = re.search(r'"weights": "([^"]+)"', text).group(1)
    rows, cols = np.tril_indices(T)
    assert np.array_equal(np.frombuffer(base64.b64decode(packed), "<f4"), weights[:, :, rows, cols].ravel())


def test_word_model_and_clear_errors(tmp_path, capsys):
    tok = WordTokenizer(["<eos>", "=", "animal", "it", "the", "tired"])
    save_model(str(tmp_path), tok, block_size=4)
    assert explore.main(["--out_dir", str(tmp_path), "--text", "the animal it"]) == 0
    assert '"tokens": ["the", "animal", "it"]' in (tmp_path / "attention.html").read_text()
    assert explore.main(["--out_dir", str(tmp_path), "--text", "the zebra"]) == 1
    assert "'zebra' is not in the vocabulary" in capsys.readouterr().err
    assert explore.main(["--out_dir", str(tmp_path), "--text", "the the the the the"]) == 1
    assert "more than the model's block_size 4" in capsys.readouterr().err
    assert explore.main(["--out_dir", str(tmp_path / "nowhere"), "--text", "the"]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="no browser driver: pip install playwright "
                                   "(the test extra has it)")
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no Chromium on this machine: apt-get install chromium (playwright's own download is not used)")
    with sync_api.sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        except Exception as e:                      # e.g. a Chromium too old for this Playwright
            pytest.skip(f"Chromium at {chromium} does not start under Playwright: {str(e).splitlines()[0]}")
        yield b
        b.close()


def shown_weights(page):
    return np.array([float(w) for w in page.eval_on_selector_all(".tok", "els => els.map(e => e.dataset.weight)")])


def test_clicking_a_token_highlights_that_row_of_attention(browser, char_page):
    path, weights = char_page
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    T = weights.shape[-1]
    assert page.locator(".tok").count() == T
    for layer, head, token in ((1, 2, 9), (0, 0, 3), (1, 0, T - 1)):
        page.select_option("#layer", str(layer))
        page.select_option("#head", str(head))
        page.click("#tok-0")                      # select one token, then another
        page.click(f"#tok-{token}")
        np.testing.assert_allclose(shown_weights(page), weights[layer, head, token], rtol=0, atol=1e-7)
    # what attends to the token: its column
    page.select_option("#direction", "col")
    np.testing.assert_allclose(shown_weights(page), weights[1, 0, :, T - 1], rtol=0, atol=1e-7)
    page.select_option("#direction", "row")
    # several tokens: shift-click adds one; the page shows the mean of their rows
    page.click("#tok-4")
    page.click("#tok-7", modifiers=["Shift"])
    np.testing.assert_allclose(shown_weights(page), weights[1, 0, [4, 7]].mean(0), rtol=0, atol=1e-7)
    # aggregates over heads and layers
    page.select_option("#head", "mean")
    np.testing.assert_allclose(shown_weights(page), weights[1, :, [4, 7]].mean((0, 1)), atol=1e-6)
    page.select_option("#layer", "max")
    page.select_option("#head", "2")
    np.testing.assert_allclose(shown_weights(page), weights[:, 2, [4, 7]].max(0).mean(0), atol=1e-6)
    page.select_option("#head", "2")                   # rollout uses the head mean, whatever head was chosen
    page.select_option("#layer", "rollout")
    np.testing.assert_allclose(shown_weights(page), explore.rollout(weights)[[4, 7]].mean(0), atol=1e-6)
    assert page.locator("#head").is_disabled()
    page.select_option("#layer", "0")
    page.select_option("#head", "mean")
    page.select_option("#layer", "rollout")
    np.testing.assert_allclose(shown_weights(page), explore.rollout(weights)[[4, 7]].mean(0), atol=1e-6)
    # all heads at once: one heatmap per head
    page.select_option("#layer", "0")
    page.select_option("#head", "grid")
    assert page.locator("#views canvas").count() == weights.shape[1]
    # hovering previews a token when none is selected
    page.click("#clear")
    page.hover("#tok-5")
    np.testing.assert_allclose(shown_weights(page), weights[0].mean(0)[5], atol=1e-6)
    png = page.evaluate("window.explorer.exportPNG()")
    assert png.startswith("data:image/png;base64,")
    assert base64.b64decode(png.split(",")[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert errors == []
    page.close()


def test_a_long_text_works_at_full_size(browser, tmp_path):
    """256 tokens, 6 layers x 6 heads: every view renders the right weights (the time is printed, not tested)."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 6, 256, 256)) * 3
    logits[..., np.triu_indices(256, 1)[0], np.triu_indices(256, 1)[1]] = -np.inf
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights = (weights / weights.sum(-1, keepdims=True)).astype(np.float32)
    path = tmp_path / "long.html"
    path.write_text(explore.page(weights, [f"w{i}" for i in range(256)], "long"))
    page = browser.new_page()
    page.goto(path.as_uri())
    page.click("#tok-200")
    ms = page.evaluate("""() => {
        const t0 = performance.now();
        for (const [layer, head] of [["5", "5"], ["3", "mean"], ["mean", "max"], ["rollout", "mean"], ["2", "grid"]]) {
            document.getElementById("layer").value = layer;
            document.getElementById("head").value = head;
            window.explorer.render();
        }
        return performance.now() - t0;
    }""")
    np.testing.assert_allclose(shown_weights(page), weights[2].mean(0)[200], atol=1e-6)
    print(f"five redraws at 256 tokens, 6 x 6 heads (one a rollout): {ms:.0f} ms")
    page.close()
