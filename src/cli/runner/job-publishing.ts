/**
 * Jobs that publish to the depot with their own credentials (issue 26): the job's runner
 * token, presented as `Authorization: Bearer job.<requestId>.<token>`, lets a job that is
 * still running publish the packages the orchestrator allowed it when it created the job
 * (`info.publish`, package-name patterns), and read; and the provenance source that tells
 * the depot which job a principal is, with the digest of its stored log.
 * Why: docs/decisions/signed-versions.md, "Provenance".
 */
import { logPages } from "../../runner/service/log-pages.js";
import { createHash } from "node:crypto";
import { RunnerDepotError } from "../../errors.js";
import { namePattern, type Authorize } from "../../depot/server/auth.js";
import type { JobProvenanceSource } from "../../depot/transactions/provenance.js";
import type { JobLogStore } from "../../runner/ports.js";
import { AGENT_PACKAGE_PREFIX } from "../../runner/agent/agent-package.js";
import { verifyJobToken, type JobTokenSecret } from "../../runner/protocol/token.js";

/** The principal of a job's own credentials. */
const JOB_PRINCIPAL = /^job:([0-9a-f-]{36})$/;

/** True for the principal of a job's own credentials (serve's per-job quota applies to it). O(1). */
export function isJobPrincipal(principal: string): boolean {
  return JOB_PRINCIPAL.test(principal);
}
/** Lines hashed per store read, and their bytes at most (and one line). */
const PAGE_LINES = 1000;
const PAGE_BYTES = 1024 * 1024;

/**
 * An `authorize` that takes a running job's credentials first and hands anything else to
 * `fallback` (the admin and packager tokens).
 *
 * @example
 * const authorize = jobCredentials({ logs, secret, fallback: bearerTokens({ [admin]: ["*"] }) });
 */
export function jobCredentials(options: { logs: JobLogStore; secret: JobTokenSecret; fallback: Authorize }): Authorize {
  return async (request, context) => {
    const header = request.headers.get("authorization") ?? "";
    const match = /^Bearer\s+job\.([0-9a-f-]{36})\.([A-Za-z0-9_-]{1,128})\s*$/i.exec(header);
    if (!match) return options.fallback(request, context);
    const requestId = match[1]!.toLowerCase();
    if (!verifyJobToken(options.secret, requestId, match[2]!))
      throw new RunnerDepotError("UNAUTHENTICATED", "The job credentials are not valid", {
        details: { wwwAuthenticate: 'Bearer realm="runner-depot", error="invalid_token"' },
      });
    const state = await options.logs.get(requestId);
    // A job publishes only while it runs: its credentials die with it.
    if (!state || state.status !== "open")
      throw new RunnerDepotError("PERMISSION_DENIED", `job ${requestId} is not running`);
    // Without a name (a transaction's first check), the second check names its package.
    if (context.action === "publish" && context.name !== undefined) {
      const allowed = Array.isArray(state.info.publish) ? (state.info.publish as unknown[]) : [];
      const name = context.name;
      // What VMs fetch and run as root is the orchestrator's alone, whatever the patterns say.
      if (name.startsWith(AGENT_PACKAGE_PREFIX))
        throw new RunnerDepotError("PERMISSION_DENIED", `job ${requestId} may not publish ${name}: the agent's name`);
      if (!allowed.some((glob) => typeof glob === "string" && namePattern(glob).test(name)))
        throw new RunnerDepotError("PERMISSION_DENIED", `job ${requestId} may not publish ${name}`);
    }
    return `job:${requestId}`;
  };
}

/**
 * The provenance source of a depot whose jobs publish with {@link jobCredentials}: the
 * job's repository and commit as the orchestrator registered them (never the VM's JobEnd),
 * and the SHA-256 of its stored log so far, as `GET /-/jobs/<id>/log` renders it (one
 * `{"line","stderr"}` JSON line per stored line). O(log lines).
 *
 * @example
 * const router = createPackageRouter(store, { provenance: { key, builderId, jobOf: jobProvenance(logs) } });
 */
export function jobProvenance(
  logs: JobLogStore,
  logUri?: (requestId: string) => string,
): (principal: string) => Promise<JobProvenanceSource | null> {
  return async (principal) => {
    const match = JOB_PRINCIPAL.exec(principal);
    if (!match) return null;
    const requestId = match[1]!;
    const state = await logs.get(requestId);
    if (!state) return null;
    const hash = createHash("sha256");
    let lines = 0;
    // The lines stored when the digest started: a job that goes on logging while it publishes is not chased.
    const size = { lines: PAGE_LINES, maxBytes: PAGE_BYTES };
    for await (const page of logPages(logs, requestId, 0, state.storedLines, size)) {
      for (const line of page) hash.update(`${JSON.stringify(line)}\n`);
      lines += page.length;
    }
    const text = (value: unknown) => (typeof value === "string" ? value : "");
    return {
      requestId,
      repository: text(state.info.repoUrl),
      commit: text(state.info.commitSha),
      logDigest: `sha256:${hash.digest("hex")}`,
      logLines: lines,
      ...(logUri ? { logUri: logUri(requestId) } : {}),
      ...(state.startedAt ? { startedOn: state.startedAt } : {}),
    };
  };
}
