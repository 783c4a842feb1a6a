#!/usr/bin/env python3
"""A Meshwork worker over gRPC that runs a command for each task, on the meshwork package.

meshwork.Worker (clients/python) registers, claims with a long poll, keeps
the lease over StreamLeases, downloads the input and uploads the result;
this file only runs the command: the task's input on stdin, its stdout the
result. See README.md next to this file.

    MESHWORK_TOKEN=mw_... /usr/bin/python3 examples/python-grpc-worker/worker.py \\
        --url 127.0.0.1:8080 --capability wc -- wc -l
"""

import argparse
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KILL_GRACE = 5  # seconds between SIGTERM and SIGKILL for the command
log = logging.getLogger("meshwork-grpc-worker")

try:
    import grpc  # noqa: F401  (only to say what is missing)
    import google.protobuf  # noqa: F401
except ImportError as e:
    print(f"worker: {e}: install Debian's python3-grpcio and python3-protobuf "
          "and run this with /usr/bin/python3", file=sys.stderr)
    sys.exit(2)
try:
    import meshwork
except ImportError:
    # Not installed (pip install ./clients/python): this checkout's copy, so
    # that the example runs from the repository as it is.
    sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
    import meshwork


def run_command(command, token):
    """The handler: runs `command` for one task; its stdout (a file) is the result."""

    def handler(job):
        env = {k: v for k, v in os.environ.items() if k != "MESHWORK_TOKEN"}  # not for the command
        env.update(MESHWORK_TASK_ID=job.task_id, MESHWORK_ATTEMPT=str(job.attempt),
                   MESHWORK_PARAMETERS=json.dumps(job.parameters))
        out_path = os.path.join(job.workdir, "stdout")
        err_path = os.path.join(job.workdir, "stderr")
        with open(job.input_path or os.devnull, "rb") as stdin, open(out_path, "wb") as out, \
                open(err_path, "wb") as err:
            try:
                # A session of its own: the whole process group can be signalled.
                proc = subprocess.Popen(command, stdin=stdin, stdout=out, stderr=err, env=env,
                                        start_new_session=True)
            except OSError as e:
                raise meshwork.Fail("CommandFailed", f"could not start the command: {e.strerror}")
            status = wait(proc, job)
        if status != 0:
            how = f"exit status {status}" if status > 0 else \
                f"killed by {signal.Signals(-status).name}"
            last = last_line(err_path)
            raise meshwork.Fail("CommandFailed", f"{how}: {scrub(last, token)}" if last else how)
        return meshwork.Result(path=out_path)

    return handler


def wait(proc, job):
    """The command's exit status; stops it (SIGTERM, then SIGKILL) once job.stop is set."""
    stopped_at = None
    while True:
        try:
            return proc.wait(timeout=0.25)
        except subprocess.TimeoutExpired:
            pass
        if stopped_at is None and job.stop.is_set():
            log.info("terminating the command: the lease is gone or the worker is stopping")
            signal_group(proc, signal.SIGTERM)
            stopped_at = time.monotonic()
        elif stopped_at is not None and time.monotonic() - stopped_at > KILL_GRACE:
            signal_group(proc, signal.SIGKILL)


def signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def last_line(path, limit=200):
    """The last non-empty line of a file, cut to `limit` characters."""
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - 4096))
        lines = [l.strip() for l in f.read().decode("utf-8", "replace").splitlines() if l.strip()]
    return lines[-1][:limit] if lines else ""


def scrub(message, token):
    """Masks the token in a message."""
    return message.replace(token, "[token]") if token else message


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
        record.msg, record.args = scrub(record.getMessage(), token), None
        return True

    logging.getLogger().handlers[0].addFilter(redact)
    if not token:
        log.warning("no token in MESHWORK_TOKEN: only a coordinator with --auth off "
                    "will accept the calls")
    url = f"https://{args.url}" if args.tls else f"http://{args.url}"
    worker = meshwork.Worker(url, token, args.capability, run_command(args.command, token),
                             name=args.name, content_type=args.content_type,
                             wait_seconds=args.wait, ca=args.ca)
    try:
        worker.run(max_tasks=args.max_tasks, idle_exit=args.idle_exit)  # SIGTERM/SIGINT stop it
        return 0
    except meshwork.MeshworkError as e:
        if e.code == "UNAUTHENTICATED":
            log.error("the coordinator refused the token (%s): check MESHWORK_TOKEN", e)
        elif e.code == "PERMISSION_DENIED":
            log.error("the token may not do this (%s): workers need a token of role worker", e)
        else:
            log.error("giving up: %s", e)
        return 1
    finally:
        worker.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
