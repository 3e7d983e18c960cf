#!/usr/bin/env python3
"""Drives serve's playground in headless Chromium through the DevTools protocol (over a pipe, so
that only Python's standard library and Debian's chromium are needed) the way a user would: types a
prompt, sets the sampling settings, clicks Generate and waits for the text; then starts a long
generation and clicks Stop; or, with --chat, turns chat mode on and sends each message in turn.
Prints one JSON object on standard output for the caller to check:
  {"text": the page's prompt + completion, "state": the page's state after Generate,
   "stop_state": its state after Stop, "stopped_chars": the characters shown when stopped,
   "cancelled": the requests /metrics counts as cancelled after Stop, "error": the page's error line,
   "chat_offered": whether the chat toggle shows, "conversation": the chat's messages {role, content}}
Exit status 3 when chromium is not installed (the caller skips), 1 on any other failure."""

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request


class Browser:
    """A headless Chromium and one page, driven by DevTools protocol messages (JSON, each ended by
    a NUL byte) on the child's fds 3 (commands in) and 4 (answers and events out)."""

    def __init__(self, executable, deadline):
        self.deadline = deadline
        self.profile = tempfile.mkdtemp(prefix="tapegrad_chromium_")
        commands_read, self.commands = os.pipe()
        self.answers, answers_write = os.pipe()
        args = [executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--remote-debugging-pipe", f"--user-data-dir={self.profile}", "--window-size=900,720",
                "about:blank"]
        self.log = open(os.path.join(self.profile, "chromium.log"), "wb")
        actions = [(os.POSIX_SPAWN_DUP2, commands_read, 3), (os.POSIX_SPAWN_DUP2, answers_write, 4),
                   (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                   (os.POSIX_SPAWN_DUP2, self.log.fileno(), 1), (os.POSIX_SPAWN_DUP2, self.log.fileno(), 2)]
        self.pid = os.posix_spawn(executable, args, os.environ, file_actions=actions)
        os.close(commands_read)
        os.close(answers_write)
        self.buffer = b""
        self.events = []
        self.next_id = 0
        self.session = None
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Page.enable")

    def close(self):
        try:
            self.call("Browser.close", session=False)
        except Exception:
            pass
        for _ in range(50):  # up to 5 s for it to go, then kill it
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                break
            time.sleep(0.1)
        else:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        for fd in (self.commands, self.answers):
            os.close(fd)
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def _message(self):
        """The next message from Chromium; raises when the deadline passes first."""
        import select
        while b"\0" not in self.buffer:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Chromium did not answer before the deadline")
            ready, _, _ = select.select([self.answers], [], [], left)
            if ready:
                data = os.read(self.answers, 1 << 20)
                if not data:
                    raise RuntimeError("Chromium closed its DevTools pipe (did it crash?)")
                self.buffer += data
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method, params=None, session=True):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self.commands, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._message()
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]
            self.events.append(answer)

    def wait_event(self, method):
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._message())

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def navigate(self, url):
        self.call("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired")

    def click(self, element_id):
        """A real mouse click at the centre of the element."""
        box = self.evaluate(f"(() => {{ const r = document.getElementById({json.dumps(element_id)})"
                            ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent",
                      {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1})

    def type_into(self, element_id, text):
        """Replaces the field's text by typing it (the field focused and its text selected first)."""
        self.evaluate(f"(() => {{ const e = document.getElementById({json.dumps(element_id)}); e.focus(); e.select(); }})()")
        self.call("Input.insertText", {"text": text})

    def wait_until(self, expression, seconds):
        """Polls a JavaScript condition until it holds; raises after `seconds`."""
        end = min(time.monotonic() + seconds, self.deadline)
        while time.monotonic() < end:
            if self.evaluate(expression):
                return
            time.sleep(0.05)
        raise TimeoutError(f"'{expression}' did not become true within {seconds} s")


def wait_until_healthy(url, seconds):
    end = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > end:
            raise TimeoutError(f"{url}/health did not answer 200 within {seconds} s")
        time.sleep(0.05)


def cancelled_requests(url):
    """The requests /metrics counts as cancelled (tapegrad_requests_cancelled_total)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("tapegrad_requests_cancelled_total "))


def chat(browser, args):
    """Chat mode: each message sent in turn, the page's conversation printed."""
    browser.wait_until("document.getElementById('model').textContent !== ''", 10)
    out = {"chat_offered": browser.evaluate("!document.getElementById('chat_toggle').hidden")}
    if out["chat_offered"]:
        browser.click("chat")
        for field, value in (("temperature", args.temperature), ("top_k", args.top_k), ("top_p", args.top_p),
                             ("max_tokens", args.max_tokens), ("seed", args.seed)):
            browser.type_into(field, value)
        for message in args.chat:
            browser.type_into("prompt", message)
            browser.click("generate")
            browser.wait_until("['done', 'error'].includes(document.body.dataset.state)", 30)
            if browser.evaluate("document.body.dataset.state") != "done":
                break
    out["state"] = browser.evaluate("document.body.dataset.state")
    out["error"] = browser.evaluate("document.getElementById('error').textContent")
    out["conversation"] = json.loads(browser.evaluate("JSON.stringify(conversation)"))
    print(json.dumps(out))
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8080")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--temperature", default="0.8")
    parser.add_argument("--top-k", default="0")
    parser.add_argument("--top-p", default="1")
    parser.add_argument("--max-tokens", default="40")
    parser.add_argument("--seed", default="7")
    parser.add_argument("--long-max-tokens", default="", help="max tokens of the generation that Stop ends "
                        "(empty: no Stop step)")
    parser.add_argument("--chat", action="append", default=[], help="a user message of a chat (repeat for "
                        "more turns): chat mode instead of a completion")
    parser.add_argument("--screenshot", default="", help="a PNG of the page after Generate")
    parser.add_argument("--timeout", type=float, default=60, help="seconds for the whole run")
    args = parser.parse_args()

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if not executable:
        print("chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 3
    browser = Browser(executable, time.monotonic() + args.timeout)
    try:
        wait_until_healthy(args.url, 30)
        browser.call("Runtime.enable")
        browser.navigate(args.url + "/")
        browser.wait_until("document.body.dataset.state === 'idle'", 10)
        if args.chat:
            return chat(browser, args)
        browser.type_into("prompt", args.prompt)
        for field, value in (("temperature", args.temperature), ("top_k", args.top_k), ("top_p", args.top_p),
                             ("max_tokens", args.max_tokens), ("seed", args.seed)):
            browser.type_into(field, value)
        browser.click("generate")
        browser.wait_until("['done', 'error'].includes(document.body.dataset.state)", 30)
        out = {"state": browser.evaluate("document.body.dataset.state"),
               "text": browser.evaluate("document.getElementById('output').textContent"),
               "status": browser.evaluate("document.getElementById('status').textContent"),
               "error": browser.evaluate("document.getElementById('error').textContent")}
        browser.wait_until("document.getElementById('model').textContent !== ''", 10)
        out["model"] = browser.evaluate("document.getElementById('model').textContent")
        if args.screenshot:
            height = browser.evaluate("Math.ceil(document.getElementById('output').getBoundingClientRect().bottom) + 24")
            shot = browser.call("Page.captureScreenshot", {"format": "png", "clip": {
                "x": 0, "y": 0, "width": 900, "height": min(height, 720), "scale": 1}})
            with open(args.screenshot, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
        if args.long_max_tokens:
            browser.type_into("max_tokens", args.long_max_tokens)
            browser.click("generate")
            # Stop once some text has arrived, so that the request is surely running on the server.
            browser.wait_until("document.getElementById('completion').textContent.length > 0", 20)
            browser.click("stop")
            browser.wait_until("document.body.dataset.state !== 'running'", 10)
            out["stop_state"] = browser.evaluate("document.body.dataset.state")
            out["stopped_chars"] = browser.evaluate("[...document.getElementById('completion').textContent].length")
            out["error"] += browser.evaluate("document.getElementById('error').textContent")
            # The server notices the closed connection within a step: wait (bounded) for the count.
            end = time.monotonic() + 5
            while True:
                out["cancelled"] = cancelled_requests(args.url)
                if out["cancelled"] >= 1 or time.monotonic() > end:
                    break
                time.sleep(0.05)
        print(json.dumps(out))
        return 0
    finally:
        browser.close()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # one clear line for the test's message, not a stack trace
        print(f"playground_browser: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
