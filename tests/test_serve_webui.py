"""The chat page at `/` in headless Chromium: load it, send a message, watch the reply stream in.

Uses Debian's `chromium` through Playwright (never `playwright install`). Screenshots of the page
mid-reply and after it go to CLOVER_SCREENSHOT_DIR when set, else to the test's temporary folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from serve_helpers import chat_factory, fixed_reply_model, live_server, sse_events

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
REPLY = "Hello from **Clover**! Here is `code` and a list:\n\n- one\n- two\n"
REASONING = "A greeting, with some Markdown."

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="chromium is not installed (apt-get install chromium)")

# Every text the assistant bubble shows while the reply streams in, recorded in the page.
WATCH = """() => {
  window.__seen = [];
  new MutationObserver(() => {
    const c = document.querySelector('.msg.assistant .content');
    if (c && c.textContent && window.__seen[window.__seen.length - 1] !== c.textContent)
      window.__seen.push(c.textContent);
  }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
}"""


@pytest.fixture(scope="module")
def server():
    model = fixed_reply_model(REPLY, reasoning=REASONING)
    with live_server(chat_factory(model, 1024), model_id="clover-webui-test", n_ctx_slot=1024) as live:
        yield live


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        yield b
        b.close()


def _shot(page, tmp_path: Path, name: str) -> Path:
    folder = Path(os.environ.get("CLOVER_SCREENSHOT_DIR") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    page.screenshot(path=str(path), full_page=True)
    return path


def _settings(page, *, thinking: bool) -> None:
    page.click("#settings-toggle")
    page.set_checked("#thinking", thinking)
    page.click("#settings-toggle")


def test_page_streams_a_reply(server, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1100, "height": 760})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    requests: list[str] = []
    page.on("request", lambda req: requests.append(req.url))
    page.goto(server.url("/"))
    page.wait_for_selector("#status-dot.ok", timeout=20_000)
    assert "clover-webui-test" in page.inner_text("#model-name")

    _settings(page, thinking=False)
    page.evaluate(WATCH)
    # Chromium's own network throttling spreads the reply's bytes over a few seconds, so that the page
    # sees it arrive in pieces however fast the tiny model writes and however busy the machine is
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.emulateNetworkConditions",
             {"offline": False, "latency": 0, "downloadThroughput": 1500, "uploadThroughput": -1})
    page.fill("#input", "Say hello, please.")
    page.press("#input", "Enter")
    page.wait_for_function("document.querySelector('.msg.assistant .content') && "
                           "document.querySelector('.msg.assistant .content').textContent.length > 0",
                           timeout=30_000)
    mid = _shot(page, tmp_path, "webui-mid-reply.png")
    page.wait_for_function("document.body.dataset.busy === ''", timeout=30_000)
    final = _shot(page, tmp_path, "webui-reply.png")
    assert mid.stat().st_size > 0 and final.stat().st_size > 0

    content = page.locator(".msg.assistant .content")
    assert content.locator("strong").inner_text() == "Clover"
    assert content.locator("code").inner_text() == "code"
    assert content.locator("li").all_inner_texts() == ["one", "two"]
    seen = page.evaluate("window.__seen")
    # streamed in pieces, not dropped in at the end: at least a first short state and the last
    assert len(seen) >= 2, seen
    # the first paint is a short start of the reply (a busy machine may merge the first deltas into one paint;
    # later states are rendered Markdown, so they need not extend each other character by character)
    assert seen[0].startswith("Hello") and len(seen[0]) < len(seen[-1]), seen
    assert seen[-1].startswith("Hello from Clover!"), seen
    assert page.inner_text(".msg.user .bubble") == "Say hello, please."
    assert "tokens" in page.inner_text(".msg.assistant .stats")
    assert page.locator(".msg.assistant .reasoning").is_hidden()
    assert all(u.startswith(server.base_url) for u in requests), requests
    assert errors == []

    page.click("#new-chat")
    assert page.locator(".msg").count() == 0
    page.close()


def test_reasoning_is_collapsible(server, browser):
    page = browser.new_page()
    page.goto(server.url("/"))
    page.wait_for_selector("#status-dot.ok", timeout=20_000)
    _settings(page, thinking=True)
    page.fill("#input", "Say hello.")
    page.press("#input", "Enter")
    page.wait_for_function("document.body.dataset.busy === ''", timeout=30_000)
    details = page.locator(".msg.assistant details.reasoning")
    assert details.get_attribute("open") is None  # folded once the answer started
    details.locator("summary").click()
    assert details.locator(".text").inner_text() == REASONING
    assert page.locator(".msg.assistant .content strong").inner_text() == "Clover"
    page.close()


def test_stop_button_cancels_the_generation(browser):
    with live_server(chat_factory(fixed_reply_model("tick tock, ", endless=True), 8192), n_ctx_slot=8192) as live:
        page = browser.new_page()
        page.goto(live.url("/"))
        page.wait_for_selector("#status-dot.ok", timeout=20_000)
        page.click("#settings-toggle")
        page.set_checked("#thinking", False)
        page.fill("#max-tokens", "8000")
        page.dispatch_event("#max-tokens", "change")
        page.click("#settings-toggle")
        page.fill("#input", "Talk forever.")
        page.press("#input", "Enter")
        page.wait_for_function("(document.querySelector('.msg.assistant .content') || {}).textContent"
                               "?.includes('tock')", timeout=30_000)
        page.click("#stop")
        page.wait_for_function("document.body.dataset.busy === ''", timeout=10_000)
        assert "stopped" in page.inner_text(".msg.assistant .stats")
        live.wait_idle(10)  # the server noticed the aborted fetch and freed the slot
        page.close()


def test_page_asks_for_the_api_key(browser):
    with live_server(chat_factory(fixed_reply_model(REPLY, reasoning=REASONING), 512), n_ctx_slot=512,
                     api_keys=("page-key",)) as live:
        page = browser.new_page()
        page.goto(live.url("/"))
        page.wait_for_selector("#keybox.needed", timeout=20_000)
        page.fill("#api-key", "page-key")
        page.dispatch_event("#api-key", "change")
        page.fill("#input", "hi")
        page.press("#input", "Enter")
        page.wait_for_function("document.body.dataset.busy === ''", timeout=30_000)
        assert page.locator(".msg.assistant .error").count() == 0
        assert "Clover" in page.inner_text(".msg.assistant .content")
        page.close()


def _ask(page, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")
    page.wait_for_function("document.body.dataset.busy === ''", timeout=30_000)


def test_conversations_survive_a_reload(server, browser):
    """The page keeps its conversations in localStorage: a reload shows the last one, a follow-up
    sends its history, and the list brings back an earlier one."""
    context = browser.new_context()
    page = context.new_page()
    bodies: list[dict] = []
    page.on("request", lambda req: bodies.append(req.post_data_json) if req.url.endswith("/chat/completions") else None)
    page.goto(server.url("/"))
    page.wait_for_selector("#status-dot.ok", timeout=20_000)
    _settings(page, thinking=True)
    assert page.inner_text("#temp-value") == "model's (0.00)"  # the test model recommends greedy
    _ask(page, "First question")
    assert "temperature" not in bodies[-1]  # the server's default: the model file's, as in clover run
    page.reload()
    page.wait_for_selector("#status-dot.ok", timeout=20_000)
    assert page.locator(".msg.user .bubble").all_inner_texts() == ["First question"]
    assert page.locator(".msg.assistant .content strong").inner_text() == "Clover"
    page.locator(".msg.assistant details.reasoning summary").click()
    assert page.locator(".msg.assistant details.reasoning .text").inner_text() == REASONING
    _ask(page, "A follow-up")
    sent = bodies[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"].startswith("Hello from **Clover**") and "reasoning_content" not in sent[1]

    page.click("#new-chat")
    _ask(page, "Second conversation")
    page.reload()
    page.wait_for_selector("#status-dot.ok", timeout=20_000)
    assert page.locator(".msg.user .bubble").all_inner_texts() == ["Second conversation"]
    titles = page.locator("#chat-list option").all_inner_texts()
    assert titles == ["New conversation", "Second conversation", "First question"]
    page.select_option("#chat-list", label="First question")
    assert page.locator(".msg.user .bubble").all_inner_texts() == ["First question", "A follow-up"]
    context.close()


def test_page_fits_a_390px_screen(server, browser, tmp_path):
    page = browser.new_page(viewport={"width": 390, "height": 844})
    page.goto(server.url("/"))
    page.wait_for_selector("#status-dot.ok", timeout=20_000)
    _ask(page, "Say hello, please, with a rather long question that has to wrap on a phone screen.")
    _shot(page, tmp_path, "webui-390px.png")
    overflow = page.evaluate("""() => {
      const out = [];
      for (const el of document.querySelectorAll('header *, footer *, #messages *')) {
        const r = el.getBoundingClientRect();
        if (r.width && (r.left < 0 || r.right > 390.5) && !el.closest('pre'))
          out.push(el.tagName + '#' + el.id + '.' + el.className);
      }
      return {out, width: document.documentElement.scrollWidth};
    }""")
    assert overflow == {"out": [], "width": 390}, overflow
    page.click("#settings-toggle")
    box = page.locator("#settings").bounding_box()
    assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390
    page.close()


def test_page_shows_the_demo_models_answer(browser, tmp_path):
    """The shipped demo model behind the page answers a sum (block diffusion, thinking off). This
    is the README's screenshot: `CLOVER_SCREENSHOT_DIR=docs` writes docs/serve-page.png."""
    with live_server(chat_factory(Path("demo"), 2048), model_id="demo", n_ctx_slot=2048) as live:
        page = browser.new_page(viewport={"width": 1000, "height": 560})
        page.goto(live.url("/"))
        page.wait_for_selector("#status-dot.ok", timeout=20_000)
        _settings(page, thinking=False)
        _ask(page, "What is 48 + 36?")
        answer = page.inner_text(".msg.assistant .content").strip()
        _shot(page, tmp_path, "serve-page.png")
        page.close()
    assert answer == "Ones: 8 + 6 = 14, write 4, carry 1. Tens: 4 + 3 + 1 = 8. So 48 + 36 = 84."


def test_at_390px_the_model_name_shows_whole_and_the_key_field_only_when_needed(browser):
    """Issue 39: the name was cut to `de…` on a phone, and a CSS rule showed the API-key field to
    every visitor; it shows only where the server asks for a key."""
    model = fixed_reply_model(REPLY, reasoning=REASONING)
    for name_id, keys in (("demo", ()), ("Diffuspace/Clover-35B-A3B-Preview-GGUF:Q4_K_M", ("page-key",))):
        with live_server(chat_factory(model, 512), model_id=name_id, n_ctx_slot=512, api_keys=keys) as live:
            page = browser.new_page(viewport={"width": 390, "height": 844})
            page.goto(live.url("/"))
            page.wait_for_function("document.getElementById('model-name').textContent.includes('ctx')",
                                   timeout=20_000)
            name = page.evaluate("""() => { const el = document.getElementById('model-name');
              const r = el.getBoundingClientRect();
              return {text: el.textContent, cut: el.scrollWidth > el.clientWidth, right: r.right}; }""")
            assert name["text"] == f"{name_id} · ctx 512" and not name["cut"] and name["right"] <= 390, name
            if keys:
                page.wait_for_selector("#keybox.needed", timeout=20_000)
            else:
                page.click("#settings-toggle")
                page.wait_for_selector("#settings.open")
            assert page.is_visible("#keybox") == bool(keys)
            page.close()


def test_a_conversation_can_be_deleted(server, browser):
    context = browser.new_context()
    page = context.new_page()
    page.goto(server.url("/"))
    page.wait_for_selector("#status-dot.ok", timeout=20_000)
    assert not page.is_visible("#delete-chat")  # nothing to delete yet
    _ask(page, "Keep me")
    page.click("#new-chat")
    _ask(page, "Delete me")
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.click("#delete-chat")
    assert page.locator("#chat-list option").all_inner_texts() == ["New conversation", "Delete me", "Keep me"]
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#delete-chat")
    assert page.locator("#chat-list option").all_inner_texts() == ["New conversation", "Keep me"]
    assert page.locator(".msg").count() == 0 and page.is_visible("#empty")
    page.reload()
    page.wait_for_selector("#status-dot.ok", timeout=20_000)
    assert page.locator("#chat-list option").all_inner_texts() == ["New conversation", "Keep me"]
    assert page.evaluate("JSON.parse(localStorage.getItem('clover.chats')).map((c) => c.title)") == ["Keep me"]
    context.close()


def test_tool_call_markup_is_a_note_on_the_page(browser):
    """A model that writes a get_weather call to a request that offered no tools: the API keeps the
    text (as llama-server), the page shows one line instead of the tags."""
    call = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"
    with live_server(chat_factory(fixed_reply_model(call), 512), n_ctx_slot=512) as live:
        page = browser.new_page()
        page.goto(live.url("/"))
        page.wait_for_selector("#status-dot.ok", timeout=20_000)
        _settings(page, thinking=False)
        _ask(page, "Weather in Oslo?")
        shown = page.inner_text(".msg.assistant .content")
        page.close()
    assert shown.strip() == 'the model tried to call get_weather(city="Oslo"); no tools were given'


def test_the_empty_page_offers_examples_that_the_demo_answers(browser):
    """The demo model behind the page: the examples are a sum, a clover fact and the weather tool
    (offered with that one, so the call shows as a call); the block preview, asked for, never shows
    a special token (end-of-text is blank)."""
    import httpx

    with live_server(chat_factory(Path("demo"), 2048), model_id="demo", n_ctx_slot=2048) as live:
        page = browser.new_page()
        bodies: list[dict] = []
        page.on("request", lambda req: bodies.append(req.post_data_json) if req.url.endswith("/chat/completions")
                else None)
        page.goto(live.url("/"))
        page.wait_for_selector("#status-dot.ok", timeout=20_000)
        page.click("#settings-toggle")
        page.set_checked("#thinking", False)
        page.fill("#max-tokens", "96")
        page.dispatch_event("#max-tokens", "change")
        page.click("#settings-toggle")
        assert page.locator("#empty .examples button").all_inner_texts() == [
            "What is 48 + 36?", "What does clover pull do?", "What is the weather in Oslo?"]
        page.click("#empty .examples button >> nth=0")
        page.wait_for_function("document.body.dataset.busy === ''", timeout=180_000)
        sums = page.inner_text(".msg.assistant .content")
        page.click("#new-chat")
        page.click("#empty .examples button >> nth=2")
        page.wait_for_function("document.body.dataset.busy === ''", timeout=180_000)
        call = page.inner_text(".msg.assistant .tools")
        page.close()
        body = {"messages": [{"role": "user", "content": "What is 48 + 36?"}], "stream": True, "max_tokens": 64,
                "return_progress": True, "decode": "diffusion", "temperature": 0,
                "chat_template_kwargs": {"enable_thinking": False}}
        with httpx.Client(base_url=live.url(""), timeout=120) as c, \
                c.stream("POST", "/v1/chat/completions", json=body) as r:
            previews = [json.loads(e)["diffusion_progress"]["preview"] for e in sse_events(r.iter_lines())
                        if e != "[DONE]" and "diffusion_progress" in e]
    assert "tools" not in bodies[0] and [t["function"]["name"] for t in bodies[1]["tools"]] == ["get_weather"]
    assert "48 + 36 = 84" in sums
    assert "get_weather" in call and "Oslo" in call
    assert previews and not any("<|" in p for p in previews), previews
