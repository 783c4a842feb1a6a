#!/usr/bin/env python3
"""A Meshwork worker in one file: Python 3.11+, standard library only.

It registers with a coordinator, then claims tasks one at a time and runs a
command for each: the task's input on stdin, its parameters as JSON in
MESHWORK_PARAMETERS, and what the command writes to stdout uploaded as the
task's result. With --listen it takes pushed work instead: the coordinator
POSTs each task to it, signed (X-Meshwork-Signature). See README.md next to
this file.

    MESHWORK_TOKEN=mw_... python3 worker.py --url http://127.0.0.1:8080 \\
        --capability wc -- wc -l
"""

import argparse
import collections
import hashlib
import hmac
import http.client
import http.server
import json
import queue
import secrets
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone

log = logging.getLogger("meshwork-worker")
TIMEOUT = 60  # seconds per socket operation of any HTTP call
TRIES = 5  # attempts of a call that keeps failing transiently
KILL_GRACE = 5  # seconds between SIGTERM and SIGKILL for the command
stopping = threading.Event()  # set by SIGTERM/SIGINT


class ApiError(Exception):
    """A failed call: an HTTP error status, or status 0 when no answer came."""

    def __init__(self, status, code, message, transient=False, retry_after=None):
        super().__init__(f"{status or 'no answer'}{' ' + code if code else ''}: {message}")
        self.status, self.code = status, code
        self.transient, self.retry_after = transient, retry_after


class LeaseLost(Exception):
    """The coordinator no longer counts this worker as the task's holder."""


class TaskFailed(Exception):
    """The attempt failed; reported through /failure with this code."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def origin(url):
    """(scheme, host, port) of a URL, with the default port filled in."""
    u = urllib.parse.urlsplit(url)
    scheme = u.scheme.lower()
    return scheme, (u.hostname or "").lower(), u.port or {"http": 80, "https": 443}.get(scheme)


class RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """API calls never follow a redirect: urllib then raises the 3xx as an error."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class DropTokenOnNewOrigin(urllib.request.HTTPRedirectHandler):
    """Downloads follow redirects, but the bearer token never leaves its origin."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and origin(newurl) != origin(req.full_url):
            new.remove_header("Authorization")
        return new


NETWORK_ERRORS = (ConnectionError, TimeoutError, socket.gaierror, http.client.HTTPException)


def open_url(opener, req):
    """Opens req; every failure becomes an ApiError that says whether to retry."""
    try:
        return opener.open(req, timeout=TIMEOUT)
    except urllib.error.HTTPError as e:
        try:
            body = json.loads(e.read(65536) or b"{}")
        except (ValueError, OSError, http.client.HTTPException):
            body = {}
        body = body if isinstance(body, dict) else {}
        wait = parse_retry_after(e.headers.get("Retry-After"))
        # 429 is a rate limit (retry) unless the body is simply too large; 5xx may pass.
        too_large = body.get("reason") == "ARTIFACT_TOO_LARGE"
        transient = e.code >= 500 or (e.code == 429 and not too_large)
        message = body.get("message", e.reason)
        code = body.get("error") or body.get("code", "")  # REST routes, or Connect JSON
        raise ApiError(e.code, code, message, transient, wait) from None
    except urllib.error.URLError as e:
        raise ApiError(0, "network", str(e.reason), isinstance(e.reason, NETWORK_ERRORS)) from None
    except NETWORK_ERRORS as e:
        raise ApiError(0, "network", str(e) or type(e).__name__, True) from None


def parse_retry_after(value):
    """Retry-After in seconds (what the coordinator sends), capped at a minute; else None."""
    try:
        return min(60.0, max(0.0, float(value)))
    except (TypeError, ValueError):
        return None  # absent, or an HTTP date: the usual backoff applies


def retrying(what, call, tries=TRIES):
    """Runs call(), again after a backoff while it fails transiently (at most `tries` times)."""
    delay = 0.5
    for attempt in range(1, tries + 1):
        try:
            return call()
        except ApiError as e:
            if not e.transient or attempt == tries:
                raise
            wait = e.retry_after if e.retry_after is not None else delay
            log.warning("%s failed (%s); retry %d/%d in %.1fs", what, e, attempt, tries - 1, wait)
            time.sleep(wait)
            delay = min(delay * 2, 10)


class Coordinator:
    """The coordinator's worker API, with the token in every call."""

    def __init__(self, url, token):
        self.url = url.rstrip("/")
        self.auth = {"Authorization": f"Bearer {token}"} if token else {}
        self.api_opener = urllib.request.build_opener(RefuseRedirects)
        self.download_opener = urllib.request.build_opener(DropTokenOnNewOrigin)

    def call(self, method, path, body, tries=TRIES):
        """A JSON call; returns the decoded answer (None for 204 No Content)."""
        data = json.dumps(body).encode()

        def once():
            headers = {**self.auth, "Content-Type": "application/json"}
            req = urllib.request.Request(self.url + path, data, headers, method=method)
            with open_url(self.api_opener, req) as res:
                raw = res.read()
            return json.loads(raw) if res.status != 204 and raw else None

        return retrying(f"{method} {path}", once, tries)

    def download(self, url, path):
        """Streams url into the file at path; returns the SHA-256 of what arrived."""

        def once():
            digest = hashlib.sha256()
            req = urllib.request.Request(url, headers=self.auth)
            with open_url(self.download_opener, req) as res, open(path, "wb") as out:
                try:
                    while chunk := res.read(1 << 16):
                        digest.update(chunk)
                        out.write(chunk)
                except NETWORK_ERRORS as e:
                    message = f"download cut short: {type(e).__name__}"
                    raise ApiError(0, "network", message, True) from None
            return digest.hexdigest()

        return retrying("input download", once)

    def upload(self, path, task_id, filename, headers):
        """Streams the file at path as a task artifact (PUT); returns the upload's answer."""
        url = f"{self.url}/tasks/{urllib.parse.quote(task_id)}/artifacts/{filename}"
        size = os.path.getsize(path)

        def once():
            with open(path, "rb") as body:  # read by http.client in blocks, never whole
                all_headers = {**self.auth, **headers, "Content-Length": str(size)}
                req = urllib.request.Request(url, body, all_headers, method="PUT")
                with open_url(self.api_opener, req) as res:
                    return json.loads(res.read())

        return retrying("upload", once)


def parse_time(text):
    """An RFC 3339 time as an aware datetime (UTC assumed when no offset is given)."""
    # At most 6 digits of a second (Python's), and Z as +00:00.
    text = re.sub(r"(\.\d{6})\d+", r"\1", text.replace("Z", "+00:00"))
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


class Lease:
    """Keeps one task's lease alive from a background thread; sets `lost` when it is gone."""

    def __init__(self, coord, worker_id, task_id, attempt, expires_at):
        self.coord, self.path = coord, f"/tasks/{urllib.parse.quote(task_id)}/heartbeat"
        self.body = {"worker_id": worker_id, "attempt": attempt}
        self.lost, self.done = threading.Event(), threading.Event()
        self.renewed(expires_at)
        self.thread = threading.Thread(target=self.run, name="heartbeat", daemon=True)
        self.thread.start()

    def renewed(self, expires_at):
        # The TTL as seen here: expiry minus the local time the answer arrived,
        # less a second (the coordinator's whole seconds may be rounded up).
        # The next heartbeat goes at a third of it: well before half.
        ttl = (parse_time(expires_at) - datetime.now(timezone.utc)).total_seconds() - 1
        now = time.monotonic()
        self.expires = now + max(ttl, 0)
        self.next_at = now + max(0.5, ttl / 3)

    def run(self):
        while not self.done.wait(max(0.0, self.next_at - time.monotonic())):
            try:
                answer = self.coord.call("POST", self.path, self.body, tries=1)
                self.renewed(answer["lease_expires_at"])
            except (ApiError, KeyError, TypeError, ValueError) as e:
                # A transient failure is tried again each second until the lease
                # would have run out; anything else (409 above all) means it is gone.
                if getattr(e, "transient", False) and time.monotonic() < self.expires:
                    log.warning("heartbeat failed (%s); trying again", e)
                    self.next_at = time.monotonic() + (getattr(e, "retry_after", None) or 1)
                    continue
                log.warning("lease lost (%s)", e)
                self.lost.set()
                return

    def stop(self):
        self.done.set()
        self.thread.join()


class Worker:
    def __init__(self, args):
        self.args = args
        self.coord = Coordinator(args.url, args.token)
        self.worker_id = None

    def register(self):
        try:
            pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            pages = 0
        answer = self.coord.call("POST", "/workers/register", {
            "name": self.args.name, "capabilities": self.args.capability,
            "cpu_count": os.cpu_count() or 0, "memory_mb": pages // (1 << 20)})
        self.worker_id = answer["worker_id"]
        log.info("registered as %s (worker %s) for %s",
                 self.args.name, self.worker_id, ", ".join(self.args.capability))

    def claim(self):
        return self.coord.call("POST", "/tasks/claim", {"worker_id": self.worker_id,
            "capabilities": self.args.capability, "max_concurrency": 1})

    def handle(self, claim):
        """Works on one claimed task from input to result (or failure)."""
        task_id, attempt = claim["task_id"], claim["attempt"]
        log.info("claimed task %s (attempt %s)", task_id, attempt)
        lease = Lease(self.coord, self.worker_id, task_id, attempt, claim["lease_expires_at"])
        try:
            with tempfile.TemporaryDirectory(prefix="meshwork-") as tmp:
                self.attempt(claim, lease, tmp)
        except LeaseLost as e:
            log.warning("task %s: lease lost (%s); dropping it", task_id, e)
        except TaskFailed as e:
            log.warning("task %s failed: %s %s", task_id, e.code, e)
            self.report_failure(task_id, attempt, e.code, str(e))
        finally:
            lease.stop()

    def attempt(self, claim, lease, tmp):
        task_id, attempt = claim["task_id"], claim["attempt"]
        input_path = self.fetch_input(claim, os.path.join(tmp, "input"))
        if lease.lost.is_set():
            raise LeaseLost("before the command started")
        if stopping.is_set():
            raise TaskFailed("Interrupted", "worker stopped before the command started")
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        status, elapsed = self.run_command(claim, input_path, out_path, err_path, lease)
        if lease.lost.is_set():
            raise LeaseLost("the command was stopped")
        if stopping.is_set() and status != 0:
            raise TaskFailed("Interrupted", "worker stopped while the command ran")
        if status != 0:
            if status > 0:
                how = f"exit status {status}"
            else:
                how = f"killed by {signal.Signals(-status).name}"
            last = last_line(err_path)
            raise TaskFailed("CommandFailed", f"{how}: {last}" if last else how)
        # Upload stdout as the artifact `output`; the coordinator checks the SHA-256.
        content_type = self.args.content_type
        headers = {"X-Worker-ID": self.worker_id, "X-Task-Attempt": str(attempt),
                   "X-Content-SHA256": sha256_file(out_path), "Content-Type": content_type}
        if claim.get("lease_token"):
            headers["X-Lease-Token"] = claim["lease_token"]  # optional: fences a stale attempt
        uploaded = self.step("UploadFailed",
                             lambda: self.coord.upload(out_path, task_id, "output", headers))
        # Complete with exactly what the upload returned (a repeat is safe: retried).
        result = {"artifact_id": uploaded["artifact_id"], "uri": uploaded["uri"],
                  "sha256": uploaded["sha256"], "content_type": content_type}
        body = {"worker_id": self.worker_id, "attempt": attempt, "result": result,
                "metrics": {"elapsed_seconds": round(elapsed, 3)}}
        path = f"/tasks/{urllib.parse.quote(task_id)}/result"
        self.step("CompletionRefused", lambda: self.coord.call("POST", path, body))
        log.info("task %s succeeded in %.1fs", task_id, elapsed)

    def step(self, code, call):
        """Runs a call under the lease: 409 means the lease is gone; other errors fail the task."""
        try:
            return call()
        except ApiError as e:
            if e.status == 409:
                raise LeaseLost(str(e)) from None
            answer = f"{e.status} {e.code}" if e.status else "nothing"
            raise TaskFailed(code, f"the coordinator answered {answer}") from None

    def fetch_input(self, claim, path):
        spec = claim.get("input")
        if not spec:
            return None
        # The token goes only to the coordinator's own origin: an input uri
        # elsewhere is fetched through the coordinator's task route instead.
        uri = urllib.parse.urljoin(self.coord.url + "/", spec.get("uri") or "")
        if not spec.get("uri") or origin(uri) != origin(self.coord.url):
            uri = f"{self.coord.url}/tasks/{urllib.parse.quote(claim['task_id'])}/input"
        digest = self.step("InputUnavailable", lambda: self.coord.download(uri, path))
        if digest != str(spec.get("sha256", "")).lower():
            raise TaskFailed("InputChecksumMismatch", "the input's SHA-256 is not the claim's")
        return path

    def run_command(self, claim, input_path, out_path, err_path, lease):
        """Runs the command; stops it when the lease is lost or the worker is told to stop."""
        hidden = ("MESHWORK_TOKEN", "MESHWORK_DISPATCH_SECRET")  # not for the command
        env = {k: v for k, v in os.environ.items() if k not in hidden}
        env["MESHWORK_TASK_ID"] = claim["task_id"]
        env["MESHWORK_ATTEMPT"] = str(claim["attempt"])
        env["MESHWORK_PARAMETERS"] = json.dumps(claim.get("parameters") or {})
        started = time.monotonic()
        with open(input_path or os.devnull, "rb") as stdin, open(out_path, "wb") as out, \
                open(err_path, "wb") as err:
            try:
                # A session of its own: the whole process group can be signalled.
                proc = subprocess.Popen(self.args.command, stdin=stdin, stdout=out, stderr=err,
                                        env=env, start_new_session=True)
            except OSError as e:
                message = f"could not start the command: {e.strerror}"
                raise TaskFailed("CommandFailed", message) from None
            stopped_at = None
            while True:
                try:
                    status = proc.wait(timeout=0.25)
                    return status, time.monotonic() - started
                except subprocess.TimeoutExpired:
                    pass
                if stopped_at is None and (lease.lost.is_set() or stopping.is_set()):
                    why = "the lease is lost" if lease.lost.is_set() else "stopping"
                    log.info("terminating the command: %s", why)
                    signal_group(proc, signal.SIGTERM)
                    stopped_at = time.monotonic()
                elif stopped_at is not None and time.monotonic() - stopped_at > KILL_GRACE:
                    signal_group(proc, signal.SIGKILL)

    def report_failure(self, task_id, attempt, code, message):
        try:
            self.coord.call("POST", f"/tasks/{urllib.parse.quote(task_id)}/failure", {
                "worker_id": self.worker_id, "attempt": attempt,
                "error_code": code, "error_message": scrub(message, self.args.token)})
        except ApiError as e:
            log.warning("could not report the failure of task %s: %s", task_id, e)

    def connect(self, method, body, tries=TRIES):
        """A Connect JSON call (POST /meshwork.v1.<Service>/<Method>): what REST lacks."""
        return self.coord.call("POST", f"/meshwork.v1.{method}", body, tries)

    def run_push(self):
        """Listens, registers with api_base_url, and runs what is dispatched until told to stop."""
        host, port = listen_address(self.args.listen)
        secret = os.environ.get("MESHWORK_DISPATCH_SECRET") or secrets.token_hex(32)
        receiver = Receiver(host, port, self.args.dispatch_path, secret)
        threading.Thread(target=receiver.serve_forever, name="receiver", daemon=True).start()
        bound = receiver.server_address[1]
        shown = socket.gethostname() if host in ("0.0.0.0", "::") else host
        base = self.args.api_base_url or f"http://{f'[{shown}]' if ':' in shown else shown}:{bound}"
        log.info("taking dispatches at http://%s:%d%s (api_base_url %s)",
                 f"[{host}]" if ":" in host else host, bound, self.args.dispatch_path, base)
        try:
            # RegisterWorker over Connect JSON: the REST register takes no dispatch fields.
            answer = self.connect("FleetService/RegisterWorker", {
                "name": self.args.name, "capabilities": self.args.capability,
                "maxConcurrency": 1, "cpuCount": os.cpu_count() or 0, "apiBaseUrl": base,
                "dispatchPath": self.args.dispatch_path, "dispatchSecret": secret})
            self.worker_id = answer["workerId"]
            log.info("registered as %s (worker %s) for %s, push",
                     self.args.name, self.worker_id, ", ".join(self.args.capability))
            receiver.registered.set()
            interval = answer.get("heartbeatIntervalSeconds") or 15
            threading.Thread(target=self.heartbeats, args=(interval,), daemon=True).start()
            done, idle_since = 0, time.monotonic()
            while not stopping.is_set():
                try:
                    dispatch = receiver.tasks.get(timeout=0.2)
                except queue.Empty:
                    idle = time.monotonic() - idle_since
                    if self.args.idle_exit is not None and idle >= self.args.idle_exit:
                        log.info("nothing dispatched for %ss; exiting", self.args.idle_exit)
                        break
                    continue
                try:
                    self.run_pushed(dispatch)
                finally:
                    receiver.done()
                done += 1
                idle_since = time.monotonic()
                if self.args.max_tasks is not None and done >= self.args.max_tasks:
                    log.info("handled %d task(s); exiting", done)
                    break
        finally:
            stopping.set()  # dispatches from now on are refused: placed elsewhere
            if self.worker_id:
                try:
                    self.connect("FleetService/DeregisterWorker", {"workerId": self.worker_id}, 2)
                except ApiError as e:
                    log.warning("could not deregister worker %s: %s", self.worker_id, e)
            receiver.shutdown()
            receiver.server_close()
        return 0

    def heartbeats(self, interval):
        """Heartbeat every `interval` seconds: a push worker makes no claims that would."""
        while not stopping.wait(interval):
            try:
                self.connect("FleetService/Heartbeat", {"workerId": self.worker_id}, tries=1)
            except ApiError as e:
                log.warning("heartbeat failed (%s)", e)

    def run_pushed(self, d):
        """StartTask (ASSIGNED → RUNNING) under the dispatch's lease, then works as on a claim."""
        task_id, attempt = d["taskId"], d["attempt"]
        log.info("dispatched task %s (attempt %s)", task_id, attempt)
        try:
            started = self.connect("LeaseService/StartTask", {"taskId": task_id,
                "workerId": self.worker_id, "attempt": attempt, "leaseToken": d["leaseToken"]})
        except ApiError as e:
            log.warning("task %s: StartTask refused (%s); not running it", task_id, e)
            return
        lease = (started.get("task") or {}).get("lease") or {}
        self.handle({"task_id": task_id, "attempt": attempt, "lease_token": d["leaseToken"],
                     "lease_expires_at": lease.get("expiresAt") or d.get("leaseExpiresAt"),
                     "input": d.get("input"), "parameters": d.get("parameters") or {}})

    def run(self):
        """Registers, then claims and works until told to stop; returns the exit status."""
        if self.args.listen:
            return self.run_push()
        self.register()
        done, idle_since = 0, time.monotonic()
        while not stopping.is_set():
            claim = self.claim()
            if claim is None:
                idle = time.monotonic() - idle_since
                if self.args.idle_exit is not None and idle >= self.args.idle_exit:
                    log.info("nothing to do for %ss; exiting", self.args.idle_exit)
                    break
                pause(self.args.poll)
                continue
            self.handle(claim)
            done += 1
            idle_since = time.monotonic()
            if self.args.max_tasks is not None and done >= self.args.max_tasks:
                log.info("handled %d task(s); exiting", done)
                break
        return 0


SIGNATURE_TOLERANCE = 300  # seconds a dispatch's timestamp may be off this clock, either way
MAX_DISPATCH_BYTES = 8 << 20  # a larger dispatch body is answered 413


def check_signature(header, body, secret, now=None):
    """None when X-Meshwork-Signature signs `body` with `secret` near `now`; else why not.

    The header is `t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`
    (several v1 are allowed); every v1 is compared in constant time.
    """
    if not header:
        return "no X-Meshwork-Signature header"
    t, given = "", []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t":
            t = value.strip()
        elif key == "v1":
            given.append(value.strip().lower().encode())
    if not (t.isascii() and t.isdigit() and len(t) <= 12):
        return "the signature has no timestamp t=<unix seconds>"
    if abs((time.time() if now is None else now) - int(t)) > SIGNATURE_TOLERANCE:
        return f"the signature's timestamp is more than {SIGNATURE_TOLERANCE} s from this clock"
    mac = hmac.new(secret.encode(), t.encode() + b"." + body, hashlib.sha256)
    expected, ok = mac.hexdigest().encode(), False
    for v1 in given:
        ok = hmac.compare_digest(v1, expected) or ok
    return None if ok else "the signature does not match the body"


def is_dispatch(body):
    return (isinstance(body, dict) and isinstance(body.get("taskId"), str) and body["taskId"]
            and isinstance(body.get("leaseToken"), str) and body["leaseToken"]
            and type(body.get("attempt")) is int and body["attempt"] >= 1)


class Receiver(http.server.ThreadingHTTPServer):
    """Takes dispatches on one path; an accepted one waits in `tasks` for the worker's loop."""

    daemon_threads = True

    def __init__(self, host, port, path, secret):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), DispatchHandler)
        self.dispatch_path, self.secret = path, secret
        self.tasks, self.lock = queue.Queue(), threading.Lock()
        # (task id, attempt) accepted here, the last 1,000: a repeat is answered 409.
        self.seen, self.seen_order = set(), collections.deque()
        self.busy = False  # a task is queued or running: one at a time (max_concurrency 1)
        self.registered = threading.Event()

    def decide(self, body):
        """(status, code, message) for a dispatch whose signature held."""
        key = (body["taskId"], body["attempt"])
        with self.lock:
            if key in self.seen:
                return 409, "already_accepted", f"attempt {key[1]} is here"
            if not self.registered.is_set():
                return 503, "not_registered", "not registered yet"
            if stopping.is_set():  # 410: the coordinator places the task elsewhere
                return 410, "stopping", "this worker is stopping"
            if self.busy:
                return 429, "at_capacity", "this worker runs one task at a time"
            self.seen.add(key)
            self.seen_order.append(key)
            if len(self.seen_order) > 1000:
                self.seen.discard(self.seen_order.popleft())
            self.busy = True
        self.tasks.put(body)
        return 202, "accepted", f"task {key[0]} accepted"

    def done(self):
        with self.lock:
            self.busy = False


class DispatchHandler(http.server.BaseHTTPRequestHandler):
    """POST {dispatch path}: checked for size and signature before anything else."""

    protocol_version = "HTTP/1.1"
    timeout = 30  # seconds a silent client may hold a connection

    def log_message(self, fmt, *args):  # the worker logs what matters itself
        pass

    def answer(self, status, code, message):
        data = json.dumps({"status" if status < 300 else "error": code, "message": message})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status >= 400:  # the rest of a refused body is not read
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data.encode())

    def do_POST(self):
        r = self.server
        if urllib.parse.urlsplit(self.path).path != r.dispatch_path:
            return self.answer(404, "not_found", "no route here")
        try:
            size = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self.answer(411, "length_required", "a dispatch needs a Content-Length")
        if size < 0 or size > MAX_DISPATCH_BYTES:
            self.answer(413, "too_large", f"the body is over {MAX_DISPATCH_BYTES} bytes")
            # Read and dropped (up to a bound), so that the client gets to read the 413.
            left = min(size, 4 * MAX_DISPATCH_BYTES)
            while left > 0 and (chunk := self.rfile.read(min(left, 1 << 16))):
                left -= len(chunk)
            return None
        body = self.rfile.read(size)
        why = check_signature(self.headers.get("X-Meshwork-Signature"), body, r.secret)
        if why:
            log.warning("refused a dispatch from %s: %s", self.client_address[0], why)
            return self.answer(401, "unauthenticated", why)
        try:
            dispatch = json.loads(body)
        except ValueError:
            dispatch = None
        if not is_dispatch(dispatch):
            return self.answer(400, "invalid_argument", "the body is not a dispatch")
        self.answer(*r.decide(dispatch))

    def do_GET(self):
        self.answer(405, "method_not_allowed", "dispatches are POSTed")


def listen_address(text):
    """(host, port) of HOST:PORT, :PORT or PORT (every interface); ValueError otherwise."""
    m = re.fullmatch(r"(?:(\[[^\]]+\]|[^:\[\]]*):)?(\d{1,5})", text.strip())
    if not m or int(m.group(2)) > 65535:
        raise ValueError(f"--listen takes HOST:PORT, :PORT or PORT, not {text!r}")
    return (m.group(1) or "").strip("[]") or "0.0.0.0", int(m.group(2))


def signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def pause(seconds):
    """Sleeps, but wakes up soon after SIGTERM/SIGINT."""
    end = time.monotonic() + seconds
    while not stopping.is_set() and time.monotonic() < end:
        time.sleep(min(0.1, max(0.0, end - time.monotonic())))


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 16):
            digest.update(chunk)
    return digest.hexdigest()


def last_line(path, limit=200):
    """The last non-empty line of a file, cut to `limit` characters."""
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - 4096))
        lines = [l.strip() for l in f.read().decode("utf-8", "replace").splitlines() if l.strip()]
    return lines[-1][:limit] if lines else ""


def scrub(message, token, paths=True):
    """Masks the token (and absolute paths) in a message."""
    if token:
        message = message.replace(token, "[token]")
    return re.sub(r"(?<![\w.])/[^\s\"':]+", "[path]", message)[:500] if paths else message


def parse_args(argv):
    """Options, then `--`, then the command (split by hand: the command's flags stay its own)."""
    split = argv.index("--") if "--" in argv else len(argv)
    argv, command = argv[:split], argv[split + 1:]
    p = argparse.ArgumentParser(
        usage="%(prog)s --url URL --capability NAME [options] -- COMMAND [ARGS...]",
        description="Claims Meshwork tasks and runs COMMAND for each.")
    p.add_argument("--url", required=True, help="the coordinator, e.g. http://127.0.0.1:8080")
    p.add_argument("--token", default=os.environ.get("MESHWORK_TOKEN", ""),
                   help="worker token (default: $MESHWORK_TOKEN, better: others can read argv)")
    p.add_argument("--capability", action="append", required=True,
                   help="a workload this worker runs (repeatable)")
    p.add_argument("--name", default=socket.gethostname(), help="worker name (default: host name)")
    p.add_argument("--max-tasks", type=int, metavar="N", help="exit after N tasks")
    p.add_argument("--idle-exit", type=float, metavar="SECONDS",
                   help="exit after SECONDS with nothing to claim")
    p.add_argument("--poll", type=float, default=1.0, metavar="SECONDS",
                   help="wait between claims that find nothing (default 1)")
    p.add_argument("--content-type", default="application/octet-stream",
                   help="media type of the output (default application/octet-stream)")
    p.add_argument("--listen", metavar="ADDR",
                   help="take pushed work on HOST:PORT, :PORT or PORT instead of claiming")
    p.add_argument("--api-base-url", metavar="URL",
                   help="where the coordinator reaches this worker (default http://HOST:PORT)")
    p.add_argument("--dispatch-path", default="/meshwork/tasks", metavar="PATH",
                   help="the path dispatches are POSTed to (default /meshwork/tasks)")
    args = p.parse_args(argv)
    if not command:
        p.error("give the command after --, e.g. -- wc -l")
    if args.max_tasks is not None and args.max_tasks < 1:
        p.error("--max-tasks must be at least 1")
    if urllib.parse.urlsplit(args.url).scheme not in ("http", "https"):
        p.error("--url must be an http:// or https:// URL")
    if args.listen is not None:
        try:
            listen_address(args.listen)
        except ValueError as e:
            p.error(str(e))
    if args.api_base_url and urllib.parse.urlsplit(args.api_base_url).scheme not in ("http", "https"):
        p.error("--api-base-url must be an http:// or https:// URL")
    if not args.dispatch_path.startswith("/"):
        p.error("--dispatch-path must start with /")
    secret = os.environ.get("MESHWORK_DISPATCH_SECRET", "")
    if secret and not 32 <= len(secret) <= 256:
        p.error("MESHWORK_DISPATCH_SECRET must be 32-256 characters")
    args.command = command
    return args


def main(argv):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")

    def redact(record):  # belt and braces: nothing logs the token, and this masks it if it did
        record.msg, record.args = scrub(record.getMessage(), args.token, paths=False), None
        return True

    logging.getLogger().handlers[0].addFilter(redact)
    if not args.token:
        log.warning("no token (--token or MESHWORK_TOKEN): only a coordinator with --auth off "
                    "will accept the calls")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())  # acted on by the loops that watch it
    try:
        return Worker(args).run()
    except ApiError as e:
        if e.status == 401:
            log.error("the coordinator refused the token (%s): check MESHWORK_TOKEN or --token", e)
        elif e.status == 403:
            log.error("the token may not do this (%s): workers need a token of role worker", e)
        elif 300 <= e.status < 400:
            log.error("the coordinator answered a redirect (%d), which a worker does not follow: "
                      "check --url", e.status)
        else:
            log.error("giving up: %s", e)
        return 1
    except (KeyError, TypeError, ValueError) as e:
        log.error("unexpected answer from the coordinator (%s: %s)", type(e).__name__, e)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
