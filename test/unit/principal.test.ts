import { Code, ConnectError, createClient, createRouterTransport } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { TokenService } from "../../gen/meshwork/v1/token_pb.js";
import { kPrincipal } from "../../src/auth/principal.js";
import { createTokenService } from "../../src/auth/service.js";
import { createLogger } from "../../src/log.js";
import { createErrorMapper } from "../../src/rpc/errors.js";
import { createRpcInterceptor } from "../../src/rpc/interceptors.js";
import { toTask } from "../../src/tasks/convert.js";

// A handler that reads the caller must never serve a call the auth
// interceptor did not see: it refuses, and does not act as an admin.
describe("the caller of an RPC", () => {
  const routes = (router: Parameters<Parameters<typeof createRouterTransport>[0]>[0]) =>
    router.service(TokenService, createTokenService({ tokens: {} as never }));
  const log = createLogger("silent");

  it("is refused (internal) when the handler runs without the auth interceptor", async () => {
    const client = createClient(
      TokenService,
      createRouterTransport(routes, {
        router: { interceptors: [createRpcInterceptor(log, createErrorMapper(toTask))] },
      }),
    );
    const error = await client.whoAmI({}).catch((e: unknown) => ConnectError.from(e));
    expect(error).toBeInstanceOf(ConnectError);
    expect((error as ConnectError).code).toBe(Code.Internal);
    expect((error as ConnectError).rawMessage).toBe("internal error");
  });

  it("is whoever the context says when something set it", async () => {
    const client = createClient(
      TokenService,
      createRouterTransport(routes, {
        router: {
          interceptors: [
            (next) => (req) => {
              req.contextValues.set(kPrincipal, { tokenId: null, name: "tester", role: "client" });
              return next(req);
            },
          ],
        },
      }),
    );
    expect((await client.whoAmI({})).token?.name).toBe("tester");
  });
});
