"""Meshwork's Python package: a client and a worker for a Meshwork coordinator.

    import meshwork

    with meshwork.Client("http://127.0.0.1:8080", token) as mw:
        task = mw.create_task("echo", {"text": "hi"})
        print(meshwork.result_value(mw.wait(task.task_id, timeout=60)))

    meshwork.Worker("http://127.0.0.1:8080", token, "echo", lambda job: job.parameters).run()

Both speak gRPC over the stubs in meshwork.v1, generated from the
coordinator's proto/meshwork (clients/python/generate.sh).
"""

from meshwork._rpc import MeshworkError
from meshwork.client import (ASSIGNED, CANCELED, FAILED, PENDING, RUNNING, SUCCEEDED, Client,
                             TaskFailed, result_value, state_name)
from meshwork.worker import Fail, Job, Result, Worker

__version__ = "0.1.0"
__all__ = ["Client", "Worker", "Job", "Result", "Fail", "TaskFailed", "MeshworkError",
           "result_value", "state_name", "PENDING", "ASSIGNED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELED"]
