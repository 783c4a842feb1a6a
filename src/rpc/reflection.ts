import {
  create,
  createFileRegistry,
  type DescFile,
  type DescMessage,
  type DescService,
  type FileRegistry,
  toBinary,
} from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";
import type { ConnectRouter } from "@connectrpc/connect";
import * as v1 from "../../gen/grpc/reflection/v1/reflection_pb.js";
import * as v1alpha from "../../gen/grpc/reflection/v1alpha/reflection_pb.js";

type ReflectionModule = typeof v1 | typeof v1alpha;

/** A registry of the given files and everything they import. */
export function registryOf(files: DescFile[]): FileRegistry {
  const ordered = new Map<string, DescFile>();
  const visit = (f: DescFile) => {
    if (ordered.has(f.name)) return;
    f.dependencies.forEach(visit);
    ordered.set(f.name, f);
  };
  files.forEach(visit);
  return createFileRegistry(
    create(FileDescriptorSetSchema, { file: [...ordered.values()].map((f) => f.proto) }),
  );
}

/**
 * gRPC server reflection (v1 and v1alpha), so that grpcurl and `buf curl`
 * work without local protos. Answers list_services, file_by_filename and
 * file_containing_symbol with the file and all it imports.
 */
export function registerReflection(
  router: ConnectRouter,
  registry: FileRegistry,
  services: DescService[],
) {
  for (const mod of [v1, v1alpha] as ReflectionModule[]) {
    router.service(mod.ServerReflection as typeof v1.ServerReflection, {
      async *serverReflectionInfo(requests) {
        for await (const req of requests) {
          yield answer(
            mod,
            registry,
            services,
            req as v1.ServerReflectionRequest,
          ) as v1.ServerReflectionResponse;
        }
      },
    });
  }
}

function withDependencies(file: DescFile): Uint8Array[] {
  const seen = new Set<string>();
  const out: Uint8Array[] = [];
  const visit = (f: DescFile) => {
    if (seen.has(f.name)) return;
    seen.add(f.name);
    out.push(toBinary(FileDescriptorProtoSchema, f.proto));
    for (const d of f.dependencies) visit(d);
  };
  visit(file);
  return out;
}

function answer(
  mod: ReflectionModule,
  registry: FileRegistry,
  services: DescService[],
  req: v1.ServerReflectionRequest,
) {
  const S = mod.ServerReflectionResponseSchema as typeof v1.ServerReflectionResponseSchema;
  const base = { validHost: req.host, originalRequest: req };
  const error = (code: number, message: string) =>
    create(S, {
      ...base,
      messageResponse: { case: "errorResponse", value: { errorCode: code, errorMessage: message } },
    });
  const files = (file: DescFile | undefined, what: string) =>
    file
      ? create(S, {
          ...base,
          messageResponse: {
            case: "fileDescriptorResponse",
            value: { fileDescriptorProto: withDependencies(file) },
          },
        })
      : error(5, `${what} not found`);
  const r = req.messageRequest;
  switch (r.case) {
    case "listServices":
      return create(S, {
        ...base,
        messageResponse: {
          case: "listServicesResponse",
          value: { service: services.map((s) => ({ name: s.typeName })) },
        },
      });
    case "fileByFilename":
      return files(registry.getFile(r.value), `file ${r.value}`);
    case "fileContainingSymbol": {
      const name = r.value.replace(/^\./, "");
      let desc = registry.get(name) as DescMessage | DescService | undefined;
      if (!desc) {
        // A method: package.Service.Method.
        const service = registry.getService(name.slice(0, name.lastIndexOf(".")));
        if (service?.methods.some((m) => m.name === name.slice(name.lastIndexOf(".") + 1)))
          desc = service;
      }
      return files(desc?.file, `symbol ${name}`);
    }
    case "allExtensionNumbersOfType":
      // Meshwork declares no extensions.
      return registry.getMessage(r.value.replace(/^\./, ""))
        ? create(S, {
            ...base,
            messageResponse: {
              case: "allExtensionNumbersResponse",
              value: { baseTypeName: r.value, extensionNumber: [] },
            },
          })
        : error(5, `type ${r.value} not found`);
    case "fileContainingExtension":
      return error(5, "extension not found");
    default:
      return error(3, "empty reflection request");
  }
}
