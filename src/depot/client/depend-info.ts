/** The `/depend` answer of a depot the client does not trust: checked before the resolver walks it. */
import { RunnerDepotError } from "../../errors.js";
import type { Requirement } from "../install/resolve.js";
import type { DependInfo } from "./types.js";

/**
 * A `/depend` answer as the resolver may trust it: an object whose `requires` (absent: none) is an array of
 * `{ name, range }` strings. Anything else is UNAVAILABLE naming the request, as an answer that is not JSON is: a
 * hostile depot's `requires: "x"` failed inside the resolver without a code. O(requires).
 */
export function dependInfoOf(body: unknown, what: string): DependInfo {
  const invalid = (why: string) =>
    new RunnerDepotError("UNAVAILABLE", `${what}: the answer is not a depend record (${why})`);
  if (typeof body !== "object" || body === null || Array.isArray(body)) throw invalid("not an object");
  const info = body as Partial<DependInfo>;
  const requires: unknown = info.requires ?? [];
  if (!Array.isArray(requires)) throw invalid("requires is not an array");
  for (const r of requires as unknown[]) {
    const entry = r as Partial<Requirement> | null;
    if (
      typeof entry !== "object" ||
      entry === null ||
      typeof entry.name !== "string" ||
      typeof entry.range !== "string"
    )
      throw invalid("a requirement is not { name, range }");
  }
  return { ...info, requires } as DependInfo;
}
