/**
 * The packager API's request headers (Pkg-Path, Pkg-Mode, Pkg-Attr, Pkg-Require,
 * Content-Length…) read and checked, each refusal with its documented code
 * (HEADER_INVALID, BAD_REQUEST: docs/depot-api.md).
 */
import { RunnerDepotError } from "../../errors.js";
import type { Requirement } from "../package/archive.js";
import { parsePackageName, parseRange } from "../package/names.js";
import { emptyRecord, setOwn } from "../store/records.js";
import { checkAttributeValue, isAttributeKey } from "../package/attributes.js";

/** The comma-separated values of a header (HTTP folds repeated headers with commas). */
function list(headers: Headers, name: string): string[] {
  const raw = headers.get(name);
  if (raw === null) return [];
  return raw
    .split(",")
    .map((v) => v.trim())
    .filter((v) => v.length > 0);
}

/** A percent-encoded header value, decoded; HEADER_INVALID naming `header` when it is not UTF-8. */
function decodeHeader(value: string, header: string): string {
  try {
    return decodeURIComponent(value);
  } catch {
    throw new RunnerDepotError("HEADER_INVALID", `${header} is not valid percent-encoded UTF-8`);
  }
}

/** The one value of a required header (decoded when `encoded`): commas inside it must be percent-encoded. */
export function single(headers: Headers, name: string, encoded: boolean): string {
  const values = list(headers, name);
  const pretty = name.replace(/(^|-)([a-z])/g, (m) => m.toUpperCase());
  if (values.length === 0) throw new RunnerDepotError("HEADER_INVALID", `${pretty} is required`);
  if (values.length > 1)
    throw new RunnerDepotError("HEADER_INVALID", `${pretty} takes one value (percent-encode commas)`);
  return encoded ? decodeHeader(values[0]!, pretty) : values[0]!;
}

/** Pkg-Mode: octal permission bits, `fallback` when the header is absent. */
export function parseMode(raw: string | null, fallback: number): number {
  if (raw === null) return fallback;
  const text = raw.trim();
  if (!/^0?[0-7]{1,3}$/.test(text) || Number.parseInt(text, 8) === 0) {
    throw new RunnerDepotError(
      "HEADER_INVALID",
      `Pkg-Mode ${JSON.stringify(text.slice(0, 20))} must be octal permission bits between 0001 and 0777`,
    );
  }
  return Number.parseInt(text, 8);
}

/** The Pkg-Attr values of `POST /add/<id>/set`: key=value pairs, the value percent-encoded free text. */
export function parseAttributes(headers: Headers): Record<string, string> {
  const attributes = emptyRecord<string>();
  const values = list(headers, "pkg-attr");
  if (values.length === 0) throw new RunnerDepotError("HEADER_INVALID", "POST /add/<id>/set needs Pkg-Attr: key=value");
  for (const value of values) {
    const eq = value.indexOf("=");
    const key = eq === -1 ? value : value.slice(0, eq);
    if (eq === -1 || !isAttributeKey(key)) {
      throw new RunnerDepotError(
        "HEADER_INVALID",
        `Pkg-Attr ${JSON.stringify(value.slice(0, 80))} is not key=value (key: letters, digits, '.', '_', '-')`,
      );
    }
    const decoded = decodeHeader(value.slice(eq + 1), "Pkg-Attr");
    checkAttributeValue(key, decoded);
    setOwn(attributes, key, decoded);
  }
  return attributes;
}

/** The Pkg-Require values of `POST /meta/<id>/require`: name@range each, the range optional. */
export function parseRequirements(headers: Headers): Requirement[] {
  const values = list(headers, "pkg-require");
  if (values.length === 0)
    throw new RunnerDepotError("HEADER_INVALID", "POST /meta/<id>/require needs Pkg-Require: name@range");
  return values.map((value) => {
    const decoded = decodeHeader(value, "Pkg-Require");
    const at = decoded.indexOf("@");
    const name = parsePackageName(at === -1 ? decoded.trim() : decoded.slice(0, at).trim());
    return { name, range: parseRange(at === -1 ? "" : decoded.slice(at + 1)) };
  });
}

/** Content-Length as a number, undefined when absent. */
export function contentLength(request: Request): number | undefined {
  const raw = request.headers.get("content-length");
  if (raw === null) return undefined;
  if (!/^\d+$/.test(raw.trim())) throw new RunnerDepotError("BAD_REQUEST", "Content-Length is not a number");
  return Number(raw);
}

/** Refuses a body on an addition that takes none (dir, link, set). */
export function requireEmpty(request: Request): void {
  const length = contentLength(request);
  if (length !== undefined && length > 0) throw new RunnerDepotError("BAD_REQUEST", "This addition takes no body");
}
