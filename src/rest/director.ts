import type { PlainRoute } from "../http/routes.js";
import { fleetRoutes } from "./director/fleet.js";
import { knowledgeRoutes } from "./director/knowledge.js";
import { leaseRoutes } from "./director/leases.js";
import { type DirectorDeps, directorRoute } from "./director/session.js";
import { taskRoutes } from "./director/tasks.js";

/**
 * The director REST contract under `/api/mesh` (camelCase JSON): the fleet
 * registry by peer id, tasks and push placement, leases named by their
 * token, status reports, results and knowledge export/import. Each route is
 * an adapter over the RPCs, called in process (in-process.ts) with the
 * caller's token: every rule, auth included, is the RPC's. A peer id is a
 * worker's `peer_id` (or, for a worker registered without one, its
 * worker_id). Every answer echoes `X-Ashlar-Correlation-Id`.
 */
export function directorRestRoutes(deps: DirectorDeps): PlainRoute[] {
  const route = directorRoute(deps);
  return [
    ...fleetRoutes(route),
    ...taskRoutes(route),
    ...leaseRoutes(route),
    ...knowledgeRoutes(route),
  ];
}
