import { Code, ConnectError } from "@connectrpc/connect";
import { ErrorInfoSchema } from "../../gen/meshwork/v1/errors_pb.js";

/** The Connect code name and ErrorInfo reason a call failed with (or "ok"). */
export async function outcome(
  call: Promise<unknown>,
): Promise<{ code: string; reason: string; message: string }> {
  try {
    await call;
    return { code: "ok", reason: "", message: "" };
  } catch (error) {
    const e = ConnectError.from(error);
    const [info] = e.findDetails(ErrorInfoSchema);
    return { code: Code[e.code], reason: info?.reason ?? "", message: e.rawMessage };
  }
}
