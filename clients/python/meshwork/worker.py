"""meshwork.Worker: register, claim tasks, keep their leases, run a handler, report the outcome."""

import hashlib
import logging
import os
import queue
import signal
import socket
import tempfile
import threading
import time

import grpc
from google.protobuf import json_format

from meshwork._rpc import CALL_TIMEOUT, Connection, MeshworkError, retryable
from meshwork.v1 import artifact_pb2, artifact_pb2_grpc, fleet_pb2, fleet_pb2_grpc
from meshwork.v1 import lease_pb2, lease_pb2_grpc

log = logging.getLogger("meshwork")
CHUNK = 64 * 1024  # bytes per UploadArtifact message
# The worker's calls are safe to repeat (an identical completion is accepted again).
RETRY = ("UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "INTERNAL")


class Fail(Exception):
    """Raised by a handler to fail the attempt with this error code (FailTask).

    With `retryable` (the default) the task runs again while it has attempts
    left; without, it ends FAILED now.
    """

    def __init__(self, code, message="", retryable=True):
        super().__init__(message or code)
        self.code, self.message, self.retryable = code, message, retryable


class Result:
    """What a handler returns to say more than a value.

    `value` (a JSON-like dict) becomes the task's result_value; `data`
    (bytes or str) or `path` (a file) is uploaded as the result artifact
    `filename`, with `content_type` (default: the worker's); `metrics`
    (name → number) and `summary` go with the completion.
    """

    def __init__(self, value=None, data=None, path=None, filename="output", content_type=None,
                 metrics=None, summary=""):
        if data is not None and path is not None:
            raise ValueError("give data or path, not both")
        self.value, self.data, self.path, self.filename = value, data, path, filename
        self.content_type, self.metrics, self.summary = content_type, metrics or {}, summary

    @classmethod
    def of(cls, outcome):
        """A handler's return value as a Result: None, a dict, bytes or str, or a Result."""
        if outcome is None or isinstance(outcome, cls):
            return outcome or cls()
        if isinstance(outcome, dict):
            return cls(value=outcome)
        if isinstance(outcome, (bytes, bytearray, str)):
            return cls(data=outcome)
        raise TypeError(f"a handler returns None, a dict, bytes, str or a Result, "
                        f"not {type(outcome).__name__}")


class Job:
    """One claimed task, as the handler sees it.

    `task_id`, `attempt`, `workload`, `name`, `correlation_id`, `parameters`
    (a dict), `input_path` (the downloaded, checked input, or None), `workdir`
    (a temporary directory, removed afterwards), `claim` (the Claim message)
    and `stop`, an Event set when the handler should stop: the lease is lost,
    the task was cancelled, or the worker is stopping.
    """

    def __init__(self, worker, claim, workdir, stop):
        self._worker, self.claim, self.workdir, self.stop = worker, claim, workdir, stop
        self.task_id, self.attempt, self.workload = claim.task_id, claim.attempt, claim.workload
        self.name, self.correlation_id = claim.name, claim.correlation_id
        self.parameters = json_format.MessageToDict(claim.parameters) \
            if claim.HasField("parameters") else {}
        self.input_path = None

    def read_input(self):
        """The input's bytes, or None when the task has none."""
        if self.input_path is None:
            return None
        with open(self.input_path, "rb") as f:
            return f.read()

    def upload(self, filename, data=None, path=None, content_type=None,
               kind=artifact_pb2.ARTIFACT_KIND_OUTPUT):
        """Uploads bytes or a file as an artifact of this attempt; returns its Artifact."""
        return self._worker._upload(self, filename, data, path, content_type, kind)


class _LeaseLost(Exception):
    """The coordinator no longer counts this worker as the task's holder."""


class Worker:
    """A worker: registers, claims one task at a time and runs `handler(job)` for it.

    `workload` is the workload (a capability) it runs, or a list of them;
    `token` (None: ``$MESHWORK_TOKEN``) a worker token. The handler returns
    None, a dict (the result value), bytes or str (the result artifact) or a
    Result, or raises Fail (or any exception, reported with its class name as
    the error code). The lease is renewed over StreamLeases meanwhile.

        def resize(job):
            return {"pixels": len(job.read_input())}

        meshwork.Worker("http://127.0.0.1:8080", token, "resize", resize).run()
    """

    def __init__(self, url, token, workload, handler, *, name=None, labels=None,
                 content_type="application/octet-stream", wait_seconds=20, ca=None):
        self.capabilities = [workload] if isinstance(workload, str) else list(workload)
        self.handler, self.name, self.labels = handler, name or socket.gethostname(), labels or {}
        self.content_type, self.wait_seconds = content_type, wait_seconds
        self._conn = Connection(url, token, ca)
        self._fleet = fleet_pb2_grpc.FleetServiceStub(self._conn.channel)
        self._leases = lease_pb2_grpc.LeaseServiceStub(self._conn.channel)
        self._artifacts = artifact_pb2_grpc.ArtifactServiceStub(self._conn.channel)
        self._stopping = threading.Event()
        self._job = None
        self.worker_id = None

    def stop(self):
        """Asks run() to return: at once when idle, after the current task otherwise."""
        self._stopping.set()
        job = self._job
        if job is not None:
            job.stop.set()

    def close(self):
        self._conn.close()

    def run(self, max_tasks=None, idle_exit=None):
        """Registers, then claims and works until stop() (or SIGTERM/SIGINT in the main thread).

        Returns after `max_tasks` tasks, or after `idle_exit` seconds with
        nothing to claim, when given. Raises MeshworkError when a call outside
        a task fails (a refused token, an unreachable coordinator).
        """
        restore = self._on_signals()
        try:
            self.register()
            done, idle_since = 0, time.monotonic()
            while not self._stopping.is_set():
                claim = self._claim()
                if claim is None:
                    if idle_exit is not None and time.monotonic() - idle_since >= idle_exit:
                        log.info("nothing to do for %ss; exiting", idle_exit)
                        break
                    continue
                self._work(claim)
                done, idle_since = done + 1, time.monotonic()
                if max_tasks is not None and done >= max_tasks:
                    log.info("handled %d task(s); exiting", done)
                    break
        finally:
            restore()

    def register(self):
        """FleetService.RegisterWorker; keeps the worker_id."""
        try:
            memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1 << 20)
        except (ValueError, OSError, AttributeError):
            memory = 0
        request = fleet_pb2.RegisterWorkerRequest(
            name=self.name, capabilities=self.capabilities, labels=self.labels,
            cpu_count=os.cpu_count() or 0, memory_mb=memory, max_concurrency=1)
        self.worker_id = self._conn.call(self._fleet.RegisterWorker, request, RETRY).worker_id
        log.info("registered as %s (worker %s) for %s",
                 self.name, self.worker_id, ", ".join(self.capabilities))

    def _on_signals(self):
        """SIGTERM and SIGINT call stop(); returns what puts the old handlers back."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        old = {sig: signal.signal(sig, lambda *_: self.stop())
               for sig in (signal.SIGTERM, signal.SIGINT)}
        return lambda: [signal.signal(sig, handler) for sig, handler in old.items()]

    def _claim(self):
        """One long poll (ClaimTasks, wait_seconds); the Claim, or None when none came."""
        request = lease_pb2.ClaimTasksRequest(worker_id=self.worker_id,
                                              capabilities=self.capabilities,
                                              max_tasks=1, wait_seconds=self.wait_seconds)

        def long_poll(req, metadata, timeout):
            # A future, so that stop() ends the wait at once.
            future = self._leases.ClaimTasks.future(req, metadata=metadata, timeout=timeout)
            while not future.done():
                if self._stopping.wait(0.1):
                    future.cancel()
                    return None
            return future.result()

        answer = self._conn.call(long_poll, request, RETRY,
                                 timeout=CALL_TIMEOUT + self.wait_seconds)
        return answer.claims[0] if answer is not None and answer.claims else None

    def _work(self, claim):
        """Runs the handler for one claimed task and reports its outcome."""
        log.info("claimed task %s (attempt %d)", claim.task_id, claim.attempt)
        stop = threading.Event()
        lease = _Lease(self, claim, on_lost=stop.set)
        try:
            with tempfile.TemporaryDirectory(prefix="meshwork-") as workdir:
                job = self._job = Job(self, claim, workdir, stop)
                if self._stopping.is_set():
                    stop.set()
                self._attempt(job, lease)
        except _LeaseLost as e:
            log.warning("task %s: lease lost (%s); dropping it", claim.task_id, e)
        except Fail as e:
            log.warning("task %s failed: %s %s", claim.task_id, e.code, e.message)
            self._fail(claim, e)
        except Exception as e:  # outside the handler (a full disk, a result value JSON cannot hold)
            log.exception("task %s failed", claim.task_id)
            self._fail(claim, Fail(type(e).__name__, str(e)))
        finally:
            self._job = None
            lease.stop()

    def _attempt(self, job, lease):
        job.input_path = self._fetch_input(job)
        if lease.lost.is_set():
            raise _LeaseLost("before the handler started")
        if self._stopping.is_set():
            raise Fail("Interrupted", "the worker stopped before the task started")
        started = time.monotonic()
        try:
            outcome = Result.of(self.handler(job))
        except Exception as e:
            if lease.lost.is_set():
                raise _LeaseLost("the handler stopped") from None
            if self._stopping.is_set():
                raise Fail("Interrupted", "the worker stopped while the task ran") from None
            if isinstance(e, Fail):
                raise
            log.exception("task %s: the handler raised", job.task_id)
            raise Fail(type(e).__name__, str(e)) from None
        elapsed = time.monotonic() - started
        if lease.lost.is_set():
            raise _LeaseLost("the handler returned after the lease was lost")
        request = lease_pb2.CompleteTaskRequest(
            task_id=job.task_id, worker_id=self.worker_id, attempt=job.attempt,
            lease_token=job.claim.lease_token, result_summary=outcome.summary,
            metrics={"elapsed_seconds": round(elapsed, 3), **outcome.metrics})
        if outcome.data is not None or outcome.path is not None:
            artifact = job.upload(outcome.filename, outcome.data, outcome.path,
                                  outcome.content_type)
            request.result.CopyFrom(artifact_pb2.ArtifactRef(
                artifact_id=artifact.artifact_id, uri=artifact.uri, sha256=artifact.sha256,
                size_bytes=artifact.size_bytes, content_type=artifact.content_type))
        if outcome.value is not None:
            request.result_value.update(outcome.value)
        self._step("CompletionRefused",
                   lambda: self._conn.call(self._leases.CompleteTask, request, RETRY))
        log.info("task %s succeeded in %.1fs", job.task_id, elapsed)

    def _step(self, code, call):
        """Runs a call under the lease: `aborted` with an ErrorInfo reason is a lease refusal."""
        try:
            return call()
        except MeshworkError as e:
            # Tell a lease refusal by its reason: a client may report a dropped
            # connection as aborted too, and only the server sends the detail.
            if e.code == "ABORTED" and e.reason:
                raise _LeaseLost(str(e)) from None
            # A request the coordinator refuses as malformed (a result value
            # over 64 KiB, …) would be refused again on every attempt.
            raise Fail(code, f"the coordinator answered {e}",
                       retryable=e.code != "INVALID_ARGUMENT") from None

    def _fetch_input(self, job):
        """Downloads the input (DownloadArtifact) into the workdir and checks its SHA-256."""
        claim = job.claim
        if not claim.HasField("input") or not claim.input.artifact_id:
            return None
        path = os.path.join(job.workdir, "input")
        request = artifact_pb2.DownloadArtifactRequest(artifact_id=claim.input.artifact_id)

        def download(req, metadata, timeout):
            digest = hashlib.sha256()
            with open(path, "wb") as out:
                for message in self._artifacts.DownloadArtifact(req, metadata=metadata,
                                                                 timeout=timeout):
                    digest.update(message.chunk)
                    out.write(message.chunk)
            return digest.hexdigest()

        digest = self._step("InputUnavailable", lambda: self._conn.call(
            download, request, RETRY, timeout=CALL_TIMEOUT * 10))
        if digest != claim.input.sha256.lower():
            raise Fail("InputChecksumMismatch", "the input's SHA-256 is not the claim's")
        return path

    def _upload(self, job, filename, data, path, content_type, kind):
        """UploadArtifact: a header (with the SHA-256 and size to check), then 64 KiB chunks."""
        if (data is None) == (path is None):
            raise ValueError("give data or path")
        if isinstance(data, str):
            data = data.encode()
        digest, size = hashlib.sha256(), 0
        for chunk in _chunks(data, path):
            digest.update(chunk)
            size += len(chunk)
        header = artifact_pb2.UploadArtifactHeader(
            task_id=job.task_id, worker_id=self.worker_id, attempt=job.attempt,
            lease_token=job.claim.lease_token, filename=filename,
            content_type=content_type or self.content_type, kind=kind,
            sha256=digest.hexdigest(), size_bytes=size)

        def upload(_, metadata, timeout):  # the messages again on every try
            return self._artifacts.UploadArtifact(_upload_messages(header, data, path),
                                                  metadata=metadata, timeout=timeout).artifact

        return self._step("UploadFailed", lambda: self._conn.call(
            upload, header, RETRY, timeout=CALL_TIMEOUT * 10))

    def _fail(self, claim, failure):
        token = self._conn.token
        message = failure.message.replace(token, "[token]") if token else failure.message
        request = lease_pb2.FailTaskRequest(
            task_id=claim.task_id, worker_id=self.worker_id, attempt=claim.attempt,
            lease_token=claim.lease_token, error_code=failure.code,
            error_message=message[:2000], retryable=failure.retryable)
        try:
            self._conn.call(self._leases.FailTask, request, RETRY)
        except MeshworkError as e:
            log.warning("could not report the failure of task %s: %s", claim.task_id, e)


def _chunks(data, path):
    if data is not None:
        for i in range(0, len(data), CHUNK):
            yield bytes(data[i:i + CHUNK])
        return
    with open(path, "rb") as f:  # read in chunks, never whole
        while chunk := f.read(CHUNK):
            yield chunk


def _upload_messages(header, data, path):
    yield artifact_pb2.UploadArtifactRequest(header=header)
    for chunk in _chunks(data, path):
        yield artifact_pb2.UploadArtifactRequest(chunk=chunk)


class _Lease:
    """Renews one lease over a StreamLeases stream from a thread; sets `lost` when it is gone.

    A renewal goes every third of the lease's TTL (well before half), and its
    answer is read before the next. LOST or CANCELED means the lease is gone.
    A broken stream is opened again while the lease can still be alive.
    """

    def __init__(self, worker, claim, on_lost):
        self.worker, self.claim, self.on_lost = worker, claim, on_lost
        self.ttl = claim.lease_seconds or 60
        self.expires = time.monotonic() + self.ttl  # no later than the coordinator's expiry
        self.lost, self.done = threading.Event(), threading.Event()
        self.outbox, self.stream = queue.Queue(), None
        self.thread = threading.Thread(target=self._run, name="meshwork-lease", daemon=True)
        self.thread.start()

    def _open(self):
        self.outbox = queue.Queue()
        requests = iter(self.outbox.get, None)  # ends when None is queued
        self.stream = self.worker._leases.StreamLeases(requests,
                                                       metadata=self.worker._conn.metadata)

    def _renew_once(self):
        """Sends one renewal and reads its answer; whether the lease is still held."""
        c, sent = self.claim, time.monotonic()
        self.outbox.put(lease_pb2.StreamLeasesRequest(
            worker_id=self.worker.worker_id,
            leases=[lease_pb2.LeaseHeartbeat(task_id=c.task_id, attempt=c.attempt,
                                             lease_token=c.lease_token)]))
        update = next(self.stream).leases[0]  # raises grpc.RpcError when the stream fails
        if update.status == lease_pb2.LEASE_STATUS_RENEWED:
            self.expires = sent + self.ttl
            return True
        why = lease_pb2.LeaseStatus.Name(update.status)
        log.warning("lease lost (%s%s)", why, f" {update.reason}" if update.reason else "")
        return False

    def _run(self):
        interval = max(0.5, self.ttl / 3)
        next_at = time.monotonic() + interval
        while not self.done.wait(max(0.0, next_at - time.monotonic())):
            try:
                if self.stream is None:
                    self._open()
                if not self._renew_once():
                    break
                next_at = time.monotonic() + interval
            except (grpc.RpcError, StopIteration) as e:
                if self.done.is_set():  # stop() cancelled the stream
                    break
                error = MeshworkError.of(e) if isinstance(e, grpc.RpcError) else None
                self._close()
                # A refusal (a bad token, an unknown worker) means the lease is gone.
                if (error is None or retryable(error, RETRY)) and time.monotonic() < self.expires:
                    log.warning("lease stream failed (%s); reopening", error or "it ended")
                    next_at = time.monotonic() + 1
                    continue
                log.warning("lease lost (%s)", error or "the stream ended")
                break
        if not self.done.is_set():
            self.lost.set()
            self.on_lost()
        self._close()

    def _close(self):
        if self.stream is not None:
            self.outbox.put(None)  # half-close: the server ends the stream
            self.stream.cancel()
            self.stream = None

    def stop(self):
        self.done.set()
        stream = self.stream
        if stream is not None:
            stream.cancel()  # wakes a renewal waiting for its answer
        self.thread.join()
