#!/usr/bin/env python3
"""A Meshwork worker over gRPC, with Debian's python3-grpcio and python3-protobuf.

It registers with a coordinator (FleetService.RegisterWorker), claims one task
at a time with a long poll (LeaseService.ClaimTasks), keeps the lease over the
StreamLeases bidirectional stream, downloads the input (DownloadArtifact), runs
a command with the input on stdin, uploads what it writes to stdout
(UploadArtifact) and completes the task with that artifact as its result
(CompleteTask), or reports the failure (FailTask). See README.md next to this
file; the stubs come from generate.sh.

    examples/python-grpc-worker/generate.sh
    MESHWORK_TOKEN=mw_... /usr/bin/python3 examples/python-grpc-worker/worker.py \\
        --url 127.0.0.1:8080 --capability wc -- wc -l
"""

import argparse
import hashlib
import json
import logging
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

log = logging.getLogger("meshwork-grpc-worker")
HERE = os.path.dirname(os.path.abspath(__file__))
CHUNK = 64 * 1024  # bytes per UploadArtifact chunk
CALL_TIMEOUT = 60  # seconds for a unary call (the long poll adds its wait)
TRIES = 5  # attempts of a call that keeps failing transiently
KILL_GRACE = 5  # seconds between SIGTERM and SIGKILL for the command
stopping = threading.Event()  # set by SIGTERM/SIGINT

try:
    import grpc
    from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool
    from google.protobuf import json_format, message_factory
except ImportError as e:
    print(f"worker: {e}: install Debian's python3-grpcio and python3-protobuf "
          "and run this with /usr/bin/python3", file=sys.stderr)
    sys.exit(2)

pb = None  # the generated modules, loaded by load_stubs()


def load_stubs(directory):
    """Imports the stubs generate.sh wrote into `directory` (meshwork/v1/*_pb2*.py)."""
    global pb
    sys.path.insert(0, directory)
    try:
        from meshwork.v1 import artifact_pb2, artifact_pb2_grpc, errors_pb2, fleet_pb2
        from meshwork.v1 import fleet_pb2_grpc, lease_pb2, lease_pb2_grpc
    except ImportError as e:
        log.error("no usable stubs in %s (%s): run examples/python-grpc-worker/generate.sh "
                  "first (or pass --stubs DIR)", directory, e)
        sys.exit(2)
    pb = argparse.Namespace(artifact=artifact_pb2, artifact_grpc=artifact_pb2_grpc,
                            errors=errors_pb2, fleet=fleet_pb2, fleet_grpc=fleet_pb2_grpc,
                            lease=lease_pb2, lease_grpc=lease_pb2_grpc)


def rpc_status_class():
    """google.rpc.Status, built from its three fields (Debian has no grpcio-status)."""
    pool = descriptor_pool.Default()
    try:
        desc = pool.FindMessageTypeByName("google.rpc.Status")
    except KeyError:
        f = descriptor_pb2.FieldDescriptorProto
        fdp = descriptor_pb2.FileDescriptorProto(
            name="google/rpc/status.proto", package="google.rpc", syntax="proto3",
            dependency=[any_pb2.DESCRIPTOR.name])
        status = fdp.message_type.add(name="Status")
        status.field.add(name="code", number=1, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
        status.field.add(name="message", number=2, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
        status.field.add(name="details", number=3, type=f.TYPE_MESSAGE,
                         label=f.LABEL_REPEATED, type_name=".google.protobuf.Any")
        pool.AddSerializedFile(fdp.SerializeToString())
        desc = pool.FindMessageTypeByName("google.rpc.Status")
    return message_factory.MessageFactory(pool).GetPrototype(desc)


class Failure(Exception):
    """A failed call: the gRPC code, the server's message and the ErrorInfo reason (or "")."""

    TRANSIENT = ("UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "INTERNAL")

    def __init__(self, error):
        self.code = error.code().name if isinstance(error, grpc.Call) else "UNKNOWN"
        self.details = (error.details() if isinstance(error, grpc.Call) else str(error)) or ""
        self.reason, self.current_attempt = error_info(error)
        why = f"; reason {self.reason}" if self.reason else ""
        super().__init__(f"{self.code}: {self.details}{why}")
        # ARTIFACT_TOO_LARGE is resource_exhausted too, but cannot succeed later.
        self.transient = self.code in self.TRANSIENT and self.reason != "ARTIFACT_TOO_LARGE"


def error_info(error):
    """(reason, current_attempt) of the meshwork.v1.ErrorInfo in grpc-status-details-bin."""
    try:
        trailers = error.trailing_metadata() or ()
    except Exception:  # not a call, or no trailers arrived
        return "", 0
    for key, value in trailers:
        if key != "grpc-status-details-bin":
            continue
        try:
            status = rpc_status_class().FromString(value)
            for detail in status.details:
                if detail.type_url.endswith("/meshwork.v1.ErrorInfo"):
                    info = pb.errors.ErrorInfo.FromString(detail.value)
                    return info.reason, info.current_attempt
        except Exception as e:  # a malformed detail is no reason to crash
            log.warning("could not decode grpc-status-details-bin: %s", e)
    return "", 0


class LeaseLost(Exception):
    """The coordinator no longer counts this worker as the task's holder."""


class TaskFailed(Exception):
    """The attempt failed; reported with FailTask under this error_code."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class Coordinator:
    """The stubs on one channel, with the bearer token in every call's metadata."""

    def __init__(self, args, token):
        options = [("grpc.enable_http_proxy", 0)]  # a loopback coordinator is never proxied
        if args.tls:
            ca = open(args.ca, "rb").read() if args.ca else None
            self.channel = grpc.secure_channel(args.url, grpc.ssl_channel_credentials(ca), options)
        else:
            self.channel = grpc.insecure_channel(args.url, options)  # h2c
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.fleet = pb.fleet_grpc.FleetServiceStub(self.channel)
        self.lease = pb.lease_grpc.LeaseServiceStub(self.channel)
        self.artifacts = pb.artifact_grpc.ArtifactServiceStub(self.channel)

    def call(self, what, method, request, tries=TRIES, timeout=CALL_TIMEOUT):
        """A unary call, again after a backoff while it fails transiently."""
        delay = 0.5
        for attempt in range(1, tries + 1):
            try:
                return method(request, metadata=self.metadata, timeout=timeout)
            except grpc.RpcError as e:
                failure = Failure(e)
                if not failure.transient or attempt == tries:
                    raise failure from None
                log.warning("%s failed (%s); retry %d/%d in %.1fs",
                            what, failure, attempt, tries - 1, delay)
                time.sleep(delay)
                delay = min(delay * 2, 10)

    def close(self):
        self.channel.close()


class Lease:
    """Renews one lease over a StreamLeases stream from a thread; sets `lost` when it is gone.

    A renewal is sent every third of the lease's TTL (well before half), and its
    answer read before the next. LOST or CANCELED means the lease is gone. If
    the stream breaks, a new one is opened while the lease can still be alive.
    """

    def __init__(self, coord, worker_id, claim):
        self.coord, self.worker_id, self.claim = coord, worker_id, claim
        self.ttl = claim.lease_seconds or 60
        self.expires = time.monotonic() + self.ttl  # no later than the coordinator's expiry
        self.lost, self.done = threading.Event(), threading.Event()
        self.outbox = queue.Queue()
        self.stream = None
        self.thread = threading.Thread(target=self.run, name="leases", daemon=True)
        self.thread.start()

    def request(self):
        c = self.claim
        return pb.lease.StreamLeasesRequest(worker_id=self.worker_id, leases=[
            pb.lease.LeaseHeartbeat(task_id=c.task_id, attempt=c.attempt,
                                    lease_token=c.lease_token)])

    def open(self):
        self.outbox = queue.Queue()
        requests = iter(self.outbox.get, None)  # ends when None is queued
        self.stream = self.coord.lease.StreamLeases(requests, metadata=self.coord.metadata)

    def renew_once(self):
        """Sends one renewal and reads its answer; returns whether the lease is still held."""
        sent = time.monotonic()
        self.outbox.put(self.request())
        answer = next(self.stream)  # raises grpc.RpcError when the stream fails
        update = answer.leases[0]
        if update.status == pb.lease.LEASE_STATUS_RENEWED:
            self.expires = sent + self.ttl
            return True
        why = pb.lease.LeaseStatus.Name(update.status)
        log.warning("lease lost (%s%s)", why, f" {update.reason}" if update.reason else "")
        return False

    def run(self):
        interval = max(0.5, self.ttl / 3)
        next_at = time.monotonic() + interval
        while not self.done.wait(max(0.0, next_at - time.monotonic())):
            try:
                if self.stream is None:
                    self.open()
                if not self.renew_once():
                    self.lost.set()
                    break
                next_at = time.monotonic() + interval
            except (grpc.RpcError, StopIteration) as e:
                if self.done.is_set():  # stop() cancelled the stream
                    break
                failure = Failure(e) if isinstance(e, grpc.RpcError) else None
                self.close_stream()
                # A broken stream is tried again each second until the lease would have
                # run out; a refusal (a bad token, an unknown worker) means it is gone.
                if (failure is None or failure.transient) and time.monotonic() < self.expires:
                    log.warning("lease stream failed (%s); reopening", failure or "ended")
                    next_at = time.monotonic() + 1
                    continue
                log.warning("lease lost (%s)", failure or "the stream ended")
                self.lost.set()
                break
        self.close_stream()

    def close_stream(self):
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


class Worker:
    def __init__(self, args, token):
        self.args, self.token = args, token
        self.coord = Coordinator(args, token)
        self.worker_id = None

    def register(self):
        try:
            memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1 << 20)
        except (ValueError, OSError, AttributeError):
            memory = 0
        answer = self.coord.call("RegisterWorker", self.coord.fleet.RegisterWorker,
                                 pb.fleet.RegisterWorkerRequest(
                                     name=self.args.name, capabilities=self.args.capability,
                                     cpu_count=os.cpu_count() or 0, memory_mb=memory,
                                     max_concurrency=1))
        self.worker_id = answer.worker_id
        log.info("registered as %s (worker %s) for %s",
                 self.args.name, self.worker_id, ", ".join(self.args.capability))

    def claim(self):
        """Claims one task, waiting up to --wait seconds for one; None when none came."""
        request = pb.lease.ClaimTasksRequest(worker_id=self.worker_id,
                                             capabilities=self.args.capability,
                                             max_tasks=1, wait_seconds=self.args.wait)

        def long_poll(req, metadata, timeout):
            # A future, so that SIGTERM/SIGINT end the wait at once.
            future = self.coord.lease.ClaimTasks.future(req, metadata=metadata, timeout=timeout)
            while not future.done():
                if stopping.wait(0.1):
                    future.cancel()
                    return None
            return future.result()

        answer = self.coord.call("ClaimTasks", long_poll, request,
                                 timeout=CALL_TIMEOUT + self.args.wait)
        return answer.claims[0] if answer is not None and answer.claims else None

    def handle(self, claim):
        """Works on one claimed task from input to result (or failure)."""
        log.info("claimed task %s (attempt %d)", claim.task_id, claim.attempt)
        lease = Lease(self.coord, self.worker_id, claim)
        try:
            with tempfile.TemporaryDirectory(prefix="meshwork-") as tmp:
                self.attempt(claim, lease, tmp)
        except LeaseLost as e:
            log.warning("task %s: lease lost (%s); dropping it", claim.task_id, e)
        except TaskFailed as e:
            log.warning("task %s failed: %s %s", claim.task_id, e.code, e)
            self.report_failure(claim, e.code, str(e))
        finally:
            lease.stop()

    def attempt(self, claim, lease, tmp):
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
            how = f"exit status {status}" if status > 0 else \
                f"killed by {signal.Signals(-status).name}"
            last = last_line(err_path)
            raise TaskFailed("CommandFailed", f"{how}: {last}" if last else how)
        artifact = self.step("UploadFailed", lambda: self.upload(claim, out_path))
        result = pb.artifact.ArtifactRef(
            artifact_id=artifact.artifact_id, uri=artifact.uri, sha256=artifact.sha256,
            size_bytes=artifact.size_bytes, content_type=artifact.content_type)
        request = pb.lease.CompleteTaskRequest(
            task_id=claim.task_id, worker_id=self.worker_id, attempt=claim.attempt,
            lease_token=claim.lease_token, result=result,
            metrics={"elapsed_seconds": round(elapsed, 3)})
        # An identical repeat of a completion is accepted, so it is retried like any call.
        self.step("CompletionRefused",
                  lambda: self.coord.call("CompleteTask", self.coord.lease.CompleteTask, request))
        log.info("task %s succeeded in %.1fs", claim.task_id, elapsed)

    def step(self, code, call):
        """Runs a call under the lease: `aborted` with an ErrorInfo is a lease refusal."""
        try:
            return call()
        except Failure as e:
            # Tell a lease refusal by its ErrorInfo reason: a client may report a
            # dropped connection as aborted too, and only the server sends the detail.
            if e.code == "ABORTED" and e.reason:
                raise LeaseLost(str(e)) from None
            raise TaskFailed(code, f"the coordinator answered {e.code}"
                             f"{' ' + e.reason if e.reason else ''}") from None

    def fetch_input(self, claim, path):
        """Downloads the input with DownloadArtifact and checks its SHA-256; None without one."""
        if not claim.HasField("input") or not claim.input.artifact_id:
            return None

        def download():
            digest = hashlib.sha256()
            request = pb.artifact.DownloadArtifactRequest(artifact_id=claim.input.artifact_id)
            try:
                with open(path, "wb") as out:
                    for message in self.coord.artifacts.DownloadArtifact(
                            request, metadata=self.coord.metadata, timeout=CALL_TIMEOUT * 10):
                        digest.update(message.chunk)
                        out.write(message.chunk)
            except grpc.RpcError as e:
                raise Failure(e) from None
            return digest.hexdigest()

        digest = self.step("InputUnavailable", lambda: retrying("input download", download))
        if digest != claim.input.sha256.lower():
            raise TaskFailed("InputChecksumMismatch", "the input's SHA-256 is not the claim's")
        return path

    def upload(self, claim, path):
        """Streams the file as the OUTPUT artifact `output`: a header, then chunks."""
        header = pb.artifact.UploadArtifactHeader(
            task_id=claim.task_id, worker_id=self.worker_id, attempt=claim.attempt,
            lease_token=claim.lease_token, filename="output",
            content_type=self.args.content_type, kind=pb.artifact.ARTIFACT_KIND_OUTPUT,
            sha256=sha256_file(path), size_bytes=os.path.getsize(path))

        def messages():
            yield pb.artifact.UploadArtifactRequest(header=header)
            with open(path, "rb") as f:  # read in chunks, never whole
                while chunk := f.read(CHUNK):
                    yield pb.artifact.UploadArtifactRequest(chunk=chunk)

        def once():
            try:
                return self.coord.artifacts.UploadArtifact(
                    messages(), metadata=self.coord.metadata, timeout=CALL_TIMEOUT * 10).artifact
            except grpc.RpcError as e:
                raise Failure(e) from None

        return retrying("upload", once)

    def run_command(self, claim, input_path, out_path, err_path, lease):
        """Runs the command; stops it when the lease is lost or the worker is told to stop."""
        env = {k: v for k, v in os.environ.items() if k != "MESHWORK_TOKEN"}  # not for the command
        env["MESHWORK_TASK_ID"] = claim.task_id
        env["MESHWORK_ATTEMPT"] = str(claim.attempt)
        env["MESHWORK_PARAMETERS"] = json_format.MessageToJson(claim.parameters, indent=None) \
            if claim.HasField("parameters") else "{}"
        started = time.monotonic()
        with open(input_path or os.devnull, "rb") as stdin, open(out_path, "wb") as out, \
                open(err_path, "wb") as err:
            try:
                # A session of its own: the whole process group can be signalled.
                proc = subprocess.Popen(self.args.command, stdin=stdin, stdout=out, stderr=err,
                                        env=env, start_new_session=True)
            except OSError as e:
                raise TaskFailed("CommandFailed",
                                 f"could not start the command: {e.strerror}") from None
            stopped_at = None
            while True:
                try:
                    return proc.wait(timeout=0.25), time.monotonic() - started
                except subprocess.TimeoutExpired:
                    pass
                if stopped_at is None and (lease.lost.is_set() or stopping.is_set()):
                    why = "the lease is lost" if lease.lost.is_set() else "stopping"
                    log.info("terminating the command: %s", why)
                    signal_group(proc, signal.SIGTERM)
                    stopped_at = time.monotonic()
                elif stopped_at is not None and time.monotonic() - stopped_at > KILL_GRACE:
                    signal_group(proc, signal.SIGKILL)

    def report_failure(self, claim, code, message):
        request = pb.lease.FailTaskRequest(
            task_id=claim.task_id, worker_id=self.worker_id, attempt=claim.attempt,
            lease_token=claim.lease_token, error_code=code,
            error_message=scrub(message, self.token))
        try:
            self.coord.call("FailTask", self.coord.lease.FailTask, request)
        except Failure as e:
            log.warning("could not report the failure of task %s: %s", claim.task_id, e)

    def run(self):
        """Registers, then claims and works until told to stop; returns the exit status."""
        self.register()
        done, idle_since = 0, time.monotonic()
        while not stopping.is_set():
            claim = self.claim()
            if claim is None:
                idle = time.monotonic() - idle_since
                if self.args.idle_exit is not None and idle >= self.args.idle_exit:
                    log.info("nothing to do for %ss; exiting", self.args.idle_exit)
                    break
                continue
            self.handle(claim)
            done += 1
            idle_since = time.monotonic()
            if self.args.max_tasks is not None and done >= self.args.max_tasks:
                log.info("handled %d task(s); exiting", done)
                break
        return 0


def retrying(what, call, tries=TRIES):
    """Runs call(), again after a backoff while it raises a transient Failure."""
    delay = 0.5
    for attempt in range(1, tries + 1):
        try:
            return call()
        except Failure as e:
            if not e.transient or attempt == tries:
                raise
            log.warning("%s failed (%s); retry %d/%d in %.1fs", what, e, attempt, tries - 1, delay)
            time.sleep(delay)
            delay = min(delay * 2, 10)


def signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


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
        usage="%(prog)s --url HOST:PORT --capability NAME [options] -- COMMAND [ARGS...]",
        description="Claims Meshwork tasks over gRPC and runs COMMAND for each. "
                    "The token comes from $MESHWORK_TOKEN.")
    p.add_argument("--url", required=True,
                   help="the coordinator as HOST:PORT, e.g. 127.0.0.1:8080 (plaintext h2c)")
    p.add_argument("--tls", action="store_true", help="use TLS instead of plaintext h2c")
    p.add_argument("--ca", metavar="FILE", help="with --tls: CA certificates (PEM) to trust")
    p.add_argument("--capability", action="append", required=True,
                   help="a workload this worker runs (repeatable)")
    p.add_argument("--name", default=socket.gethostname(), help="worker name (default: host name)")
    p.add_argument("--max-tasks", type=int, metavar="N", help="exit after N tasks")
    p.add_argument("--idle-exit", type=float, metavar="SECONDS",
                   help="exit after SECONDS with nothing to claim")
    p.add_argument("--wait", type=int, default=20, metavar="SECONDS",
                   help="long poll: how long one claim waits for a task (0-30, default 20)")
    p.add_argument("--content-type", default="application/octet-stream",
                   help="media type of the output (default application/octet-stream)")
    p.add_argument("--stubs", default=os.environ.get("MESHWORK_STUBS", os.path.join(HERE, "gen")),
                   metavar="DIR", help="where generate.sh wrote the stubs "
                   "(default: $MESHWORK_STUBS, else gen/ next to this file)")
    args = p.parse_args(argv)
    if not command:
        p.error("give the command after --, e.g. -- wc -l")
    if args.max_tasks is not None and args.max_tasks < 1:
        p.error("--max-tasks must be at least 1")
    if not 0 <= args.wait <= 30:
        p.error("--wait must be 0-30")
    if "://" in args.url or not re.fullmatch(r"[^\s/]+:\d+", args.url):
        p.error("--url must be HOST:PORT, e.g. 127.0.0.1:8080 (add --tls for TLS)")
    args.command = command
    return args


def main(argv):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s grpc-worker %(levelname)s %(message)s")
    token = os.environ.get("MESHWORK_TOKEN", "")

    def redact(record):  # belt and braces: nothing logs the token, and this masks it if it did
        record.msg, record.args = scrub(record.getMessage(), token, paths=False), None
        return True

    logging.getLogger().handlers[0].addFilter(redact)
    load_stubs(args.stubs)
    if not token:
        log.warning("no token in MESHWORK_TOKEN: only a coordinator with --auth off "
                    "will accept the calls")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())  # acted on by the loops that watch it
    worker = Worker(args, token)
    try:
        return worker.run()
    except Failure as e:
        if e.code == "UNAUTHENTICATED":
            log.error("the coordinator refused the token (%s): check MESHWORK_TOKEN", e)
        elif e.code == "PERMISSION_DENIED":
            log.error("the token may not do this (%s): workers need a token of role worker", e)
        else:
            log.error("giving up: %s", e)
        return 1
    finally:
        worker.coord.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
