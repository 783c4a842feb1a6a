"""Run by python-client.test.ts with the venv's Python, where the meshwork package is installed.

    python python-client.py URL CLIENT_TOKEN WORKER_TOKEN WORKLOAD

A meshwork.Worker runs in a thread while a meshwork.Client creates tasks and
waits for them; prints one JSON object per case on stdout.
"""

import json
import logging
import sys
import threading
import time

import meshwork

url, client_token, worker_token, workload = sys.argv[1:5]
logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(asctime)s %(threadName)s %(levelname)s %(message)s")


def report(case, **fields):
    print(json.dumps({"case": case, **fields}), flush=True)


stopped = threading.Event()  # set when the "block" handler has been told to stop


def handler(job):
    mode = job.parameters["mode"]
    if mode == "ok":
        data = job.read_input()
        return meshwork.Result(value={"length": len(data), "word": job.parameters["word"]},
                               data=data.upper(), content_type="text/plain",
                               metrics={"bytes": len(data)})
    if mode == "fail":
        raise meshwork.Fail("BadInput", "the input is not good", retryable=False)
    if mode == "crash":
        raise ValueError("the handler broke")
    if mode == "block":  # runs until the lease is gone (the task is cancelled)
        if job.stop.wait(60):
            stopped.set()
        return None
    raise AssertionError(mode)


worker = meshwork.Worker(url, worker_token, workload, handler, name="python-client-test",
                         wait_seconds=1)
thread = threading.Thread(target=worker.run, name="worker")
thread.start()
report("installed", file=meshwork.__file__)

with meshwork.Client(url, client_token) as mw:
    created = mw.create_task(workload, {"mode": "ok", "word": "hi"}, input=b"hello",
                             lease_seconds=5)
    done = mw.wait(created.task_id, timeout=30)
    report("ok", task_id=done.task_id, state=meshwork.state_name(done.state),
           value=meshwork.result_value(done), result=mw.result_bytes(done).decode(),
           metrics=dict(done.metrics))

    for mode in ("fail", "crash"):
        created = mw.create_task(workload, {"mode": mode}, max_attempts=1)
        try:
            mw.wait(created.task_id, timeout=30)
            report(mode, raised=False)
        except meshwork.TaskFailed as e:
            report(mode, raised=True, task_id=e.task.task_id, state=e.state, code=e.code,
                   message=e.message)

    # Cancel a running task: wait raises, and the worker's handler is told to stop.
    created = mw.create_task(workload, {"mode": "block"}, lease_seconds=5)
    while mw.get_task(created.task_id).state == meshwork.PENDING:
        time.sleep(0.1)
    cancelled = mw.cancel_task(created.task_id, reason="not needed")
    try:
        mw.wait(created.task_id, timeout=30)
        report("cancel", raised=False)
    except meshwork.TaskFailed as e:
        report("cancel", raised=True, task_id=e.task.task_id, state=e.state,
               returned=meshwork.state_name(cancelled.state),
               handler_stopped=stopped.wait(30))  # by the lease stream, not worker.stop()

    # Nobody runs this workload: wait gives up; the task is then cancelled.
    idle = mw.create_task(f"{workload}-nobody", {})
    try:
        mw.wait(idle.task_id, timeout=0.5)
        report("timeout", raised=False)
    except TimeoutError as e:
        report("timeout", raised=True, message=str(e))

    # A repeated idempotency key gives the same task; an unknown id is NOT_FOUND.
    first = mw.create_task(f"{workload}-nobody", {"n": 1}, idempotency_key=f"{workload}-key")
    again = mw.create_task(f"{workload}-nobody", {"n": 1}, idempotency_key=f"{workload}-key")
    try:
        mw.get_task("00000000-0000-4000-8000-000000000000")
        missing = None
    except meshwork.MeshworkError as e:
        missing = e.code
    report("misc", same=first.task_id == again.task_id, missing=missing)
    for task in (idle, first):
        mw.cancel_task(task.task_id)

    # A cancelled task runs again after rerun_task.
    rerun = mw.rerun_task(idle.task_id)
    report("rerun", state=meshwork.state_name(rerun.state))
    mw.cancel_task(idle.task_id)

worker.stop()
thread.join(30)
report("stopped", alive=thread.is_alive())
worker.close()
