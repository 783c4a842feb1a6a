"""meshwork.Client: create tasks, wait for them, read their results, cancel and rerun them."""

import datetime
import time
import uuid

import grpc
from google.protobuf import json_format

from meshwork._rpc import Connection, MeshworkError
from meshwork.v1 import artifact_pb2, artifact_pb2_grpc, task_pb2, task_pb2_grpc

PENDING = task_pb2.TASK_STATE_PENDING
ASSIGNED = task_pb2.TASK_STATE_ASSIGNED
RUNNING = task_pb2.TASK_STATE_RUNNING
SUCCEEDED = task_pb2.TASK_STATE_SUCCEEDED
FAILED = task_pb2.TASK_STATE_FAILED
CANCELED = task_pb2.TASK_STATE_CANCELED
TERMINAL = (SUCCEEDED, FAILED, CANCELED)


def state_name(state):
    """``"SUCCEEDED"`` for TASK_STATE_SUCCEEDED, and so on."""
    return task_pb2.TaskState.Name(state).removeprefix("TASK_STATE_")


def result_value(task):
    """A task's result_value (CompleteTaskRequest.result_value) as a dict; None without one."""
    return json_format.MessageToDict(task.result_value) if task.HasField("result_value") else None


class TaskFailed(Exception):
    """Raised by Client.wait for a task that ended FAILED or CANCELED.

    `task` is the task as it ended, `state` ``"FAILED"`` or ``"CANCELED"``,
    `code` and `message` its error (e.g. ``"CommandFailed"``, ``"TIMEOUT"``).
    """

    def __init__(self, task):
        self.task, self.state = task, state_name(task.state)
        self.code, self.message = task.error.code, task.error.message
        super().__init__(f"task {task.task_id} {self.state}: {self.code}: {self.message}")


class Client:
    """A client of a coordinator's TaskService over gRPC.

    `url` is ``http://HOST:PORT`` (h2c), ``https://HOST[:PORT]`` (TLS, with
    `ca` a PEM file to trust) or ``HOST:PORT``; `token` (default
    ``$MESHWORK_TOKEN``) a client or admin token. Tasks come back as
    ``meshwork.v1.task_pb2.Task`` messages. Only UNAVAILABLE is retried: every
    create carries an idempotency key, so a retried create makes one task.

        with meshwork.Client("http://127.0.0.1:8080", token) as mw:
            task = mw.create_task("resize", {"width": 640}, input=b"...")
            done = mw.wait(task.task_id, timeout=600)
    """

    def __init__(self, url, token=None, *, ca=None):
        self._conn = Connection(url, token, ca)
        self._tasks = task_pb2_grpc.TaskServiceStub(self._conn.channel)
        self._artifacts = artifact_pb2_grpc.ArtifactServiceStub(self._conn.channel)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._conn.close()

    def create_task(self, workload, parameters=None, **options):
        """Creates a task and returns it (PENDING, or the existing task for a repeated key).

        `parameters` is a JSON-like dict (numbers arrive as floats). Options:
        `input` (bytes, ≤ 1 MiB), `idempotency_key` (default: a new UUID; ""
        for none), `run_at` (datetime; naive means UTC) or `delay` (seconds or
        timedelta), `deadline` (datetime), `depends_on` (task ids, or
        ``"ref:NAME"`` within create_tasks), `ref`, `timeout_seconds`, and any
        other CreateTaskRequest field by name (`name`, `priority`,
        `max_attempts`, `lease_seconds`, `resources`, …).
        """
        request = task_request(workload, parameters, **options)
        return self._conn.call(self._tasks.CreateTask, request).task

    def create_tasks(self, tasks):
        """Creates 1–1,000 tasks in one transaction; each a dict of create_task's arguments.

            a, b = mw.create_tasks([
                {"workload": "fetch", "ref": "a"},
                {"workload": "train", "depends_on": ["ref:a"]},
            ])
        """
        request = task_pb2.CreateTasksRequest(tasks=[task_request(**t) for t in tasks])
        return list(self._conn.call(self._tasks.CreateTasks, request).tasks)

    def get_task(self, task_id):
        """The task as it is now."""
        return self._conn.call(self._tasks.GetTask, task_pb2.GetTaskRequest(task_id=task_id)).task

    def cancel_task(self, task_id, reason=""):
        """Cancels a PENDING, ASSIGNED or RUNNING task; returns it, CANCELED."""
        request = task_pb2.CancelTaskRequest(task_id=task_id, reason=reason)
        # Sent once: a cancel repeated after a lost answer is refused as if it had not happened.
        return self._conn.call(self._tasks.CancelTask, request, retry=()).task

    def rerun_task(self, task_id, rerun_dependents=False):
        """Puts a FAILED or CANCELED task back to PENDING; returns it."""
        request = task_pb2.RerunTaskRequest(task_id=task_id, rerun_dependents=rerun_dependents)
        # Sent once, as cancel_task.
        return self._conn.call(self._tasks.RerunTask, request, retry=()).task

    def wait(self, task_id, timeout=None):
        """Waits for the task to end (WatchTask) and returns it when it SUCCEEDED.

        Raises TaskFailed when it ended FAILED or CANCELED, TimeoutError when
        it has not ended after `timeout` seconds (None: no limit). A broken
        watch is opened again.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        task = None
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                state = state_name(task.state) if task is not None else "unknown"
                raise TimeoutError(f"task {task_id} is still {state} after {timeout}s")
            try:
                for message in self._tasks.WatchTask(task_pb2.WatchTaskRequest(task_id=task_id),
                                                     metadata=self._conn.metadata,
                                                     timeout=remaining):
                    task = message.task
                    if task.state == SUCCEEDED:
                        return task
                    if task.state in TERMINAL:
                        raise TaskFailed(task)
            except grpc.RpcError as e:
                error = MeshworkError.of(e)
                # Our own deadline ends the loop above; a dropped connection, or a
                # server that ends long streams, is watched again.
                if error.code not in ("DEADLINE_EXCEEDED", "UNAVAILABLE", "CANCELLED"):
                    raise error from None
            time.sleep(0.2)  # the stream ended before the task did: watch again

    def result_bytes(self, task):
        """The bytes of a task's result artifact (DownloadArtifact); None without one."""
        if not task.HasField("result") or not task.result.artifact_id:
            return None
        request = artifact_pb2.DownloadArtifactRequest(artifact_id=task.result.artifact_id)
        try:
            stream = self._artifacts.DownloadArtifact(request, metadata=self._conn.metadata,
                                                      timeout=600)
            return b"".join(message.chunk for message in stream)
        except grpc.RpcError as e:
            raise MeshworkError.of(e) from None


def task_request(workload, parameters=None, *, input=None, idempotency_key=None, run_at=None,
                 delay=None, deadline=None, **fields):
    """The CreateTaskRequest for create_task's arguments (see there)."""
    request = task_pb2.CreateTaskRequest(
        workload=workload,
        idempotency_key=str(uuid.uuid4()) if idempotency_key is None else idempotency_key,
        **fields)
    if parameters is not None:
        request.parameters.update(parameters)
    if input is not None:
        request.input_data = input.encode() if isinstance(input, str) else bytes(input)
    if run_at is not None and delay is not None:
        raise ValueError("give run_at or delay, not both")
    if run_at is not None:
        request.run_at.FromDatetime(_utc(run_at))
    if delay is not None:
        if not isinstance(delay, datetime.timedelta):
            delay = datetime.timedelta(seconds=delay)
        request.delay.FromTimedelta(delay)
    if deadline is not None:
        request.deadline.FromDatetime(_utc(deadline))
    return request


def _utc(moment):
    """A datetime in UTC, naive as protobuf wants it (a naive one is taken as UTC)."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    return moment
