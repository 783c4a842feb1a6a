import { createContextKey } from "@connectrpc/connect";

/** The request's correlation id: read from `x-correlation-id` or generated. */
export const kCorrelationId = createContextKey<string>("", { description: "correlation id" });
