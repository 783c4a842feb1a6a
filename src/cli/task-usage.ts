import { endpointHelp } from "./args.js";
import { taskLogsUsage } from "./task-logs.js";

/** `meshwork task --help`. */
export const usage = `Usage:
  meshwork task create --workload W [--name N] [--param K=V]... [--params JSON]
                       [--input FILE | --input-artifact ID] [--capability C]...
                       [--affinity K=V]... [--priority N] [--max-attempts N]
                       [--lease-seconds N] [--steps N] [--deadline ISO]
                       [--idempotency-key K] [--resources NAME=N,...]
                       [--require REQ]... [--prefer WEIGHT:REQ]... [--share PATH]
                       [--concurrency-key K] [--rate-key K] [--at ISO | --in 5m]
                       [--depends-on TASK_ID]... [--all-done] [--timeout 2h]
                       [--dispatch | --no-dispatch]
  meshwork task get TASK_ID
  meshwork task why TASK_ID
  meshwork task list [--state S] [--workload W] [--worker WORKER] [--limit N]
  meshwork task cancel TASK_ID... [--reason TEXT]
  meshwork task cancel [TASK_ID...] FILTER [--reason TEXT] [--dry-run]
  meshwork task rerun TASK_ID... | TASK_ID --dependents
  meshwork task rerun [TASK_ID...] FILTER [--dry-run]
  meshwork task retry TASK_ID [--lease-seconds N] [--idempotency-key K]
  meshwork task watch TASK_ID
  meshwork task logs TASK_ID [-f] [--attempt N]

FILTER (cancel, rerun; every flag given narrows it):
  --state S...             the states (cancel: pending, assigned, running;
                           rerun: failed, canceled; default all of them)
  --workload W
  --created-after ISO      created at or after
  --created-before ISO     created before

'create' prints the new task id alone on stdout (a summary on stderr).
  --input FILE uploads FILE as an INPUT artifact first and names it as the
  task's input; --input-artifact takes one uploaded by 'meshwork artifact put'.
  --param K=V sets one parameter (V is parsed as JSON when it parses, else
  kept as a string); --params takes a JSON object.
  --resources is what an attempt holds on its worker: cpu (millicores),
  memory (MiB), gpu, slots (default 1) or names of your own, e.g.
  --resources cpu=2000,memory=4096,gpu=1. --require (all must hold) and
  --prefer (weights rank the workers) take label selectors:
  KEY in (A,B), KEY notin (A), KEY=V, KEY!=V, KEY, !KEY, KEY>N, KEY<N.
  --share charges the task to a share-tree path (default: your token's
  name); --concurrency-key and --rate-key name limits set with
  'meshwork limit' and 'meshwork rate' (docs/scheduling.md).
  --at ISO or --in DURATION (90s, 5m, 2h, 1d) holds the task back until
  then. --depends-on TASK_ID (repeated, or comma-separated) makes it wait
  for those tasks: it runs once they all SUCCEEDED (and fails when one
  does not), or once they all finished with --all-done. --timeout bounds
  each attempt's running time (TIMEOUT past it; docs/workflows.md).
  --dispatch: the coordinator delivers the task to the worker a push
  placement chooses (POST to its api_base_url; --no-dispatch: not; unset:
  the coordinator's --dispatch-default; docs/protocol.md#push-placement).
'why' says why a PENDING task waits: every reason a claim or placement
  would pass it over now, and its place in its share's queue.
'list' pages newest first, up to --limit tasks (default 100, at most 10000).
  --worker takes a worker id, peer id or name.
  States: pending, assigned, running, succeeded, failed, canceled.
'cancel' moves a PENDING, ASSIGNED or RUNNING task to CANCELED; with a
  filter or several ids (CancelTasks), every live task it matches, at most
  10,000 a call (oldest first: run it again for the rest).
'rerun' puts a FAILED or CANCELED task back to PENDING to run again
  (RerunTask): same id, parameters and input, a fresh attempt budget, the
  next attempt number (a worker of an earlier attempt stays fenced), a RERUN
  event in its history. With a filter or several ids (RerunTasks), every
  FAILED or CANCELED task it matches, at most 10,000 a call.
  --dependents also reruns the tasks that failed because this one did.
  --dry-run counts what a filter matches and changes nothing.
'retry' is RetryTask, a push placement: it puts an ASSIGNED, RUNNING or
  FAILED task on another worker that has an API base URL and a free slot
  (the same worker if it is the only fit), ASSIGNED under a new attempt that
  fences the old lease. For a task with dispatch the coordinator delivers it
  to that worker; otherwise a director must send it the task id, attempt
  and lease token ('--json' prints them). For pull workers, 'rerun' runs a
  failed task again.
'watch' follows WatchTask, one line per change, until the task ends. Exits 0
  when it SUCCEEDED, 3 when it FAILED or was CANCELED. With --json, one Task
  JSON document per line.
${taskLogsUsage}
${endpointHelp}`;
