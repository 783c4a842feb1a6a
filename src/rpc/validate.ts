import { isUuid } from "../db/paging.js";
import { invalid } from "./errors.js";

/** Checks a required id: a UUID, else `invalid_argument`. */
export function uuidField(field: string, value: string): string {
  if (value === "") throw invalid(`${field} is required`);
  if (!isUuid(value))
    throw invalid(`${field} must be a UUID, not ${JSON.stringify(value.slice(0, 64))}`);
  return value.toLowerCase();
}
