/**
 * The control API `serve` adds under `/-/` on the depot's port, for the `job`, `logs`,
 * `jobs` and `cancel` commands: create a job (mint its token, register it, render its
 * cloud-init), read, follow or search its log (or read one section of it), read its sections, list jobs
 * and cancel one (control-jobs.ts).
 * Every request needs the admin token.
 */
import { randomUUID, timingSafeEqual } from "node:crypto";
import { RunnerDepotError } from "../../errors.js";
import { mintJobToken, renderCloudInit, type CloudInitAgent, type RunnerService } from "../../runner/index.js";
import type { JobLogStore, StoredLine } from "../../runner/ports.js";
import { cancelJobRoute, jobSectionsRoute, listJobsRoute, requestIdOf } from "./control-jobs.js";
import { searchJobLog, searchRequestOf } from "../../runner/service/log-search.js";
import { sectionLines } from "../../runner/service/log-sections.js";
import { logPages } from "../../runner/service/log-pages.js";
import { readBounded } from "../../depot/client/body.js";
import { clientGone } from "../../depot/server/native-body.js";
import type { RetentionPolicy, RetentionReport } from "../../depot/store/retention.js";

/** Lines read from the store per page when not following (one read per page), and their bytes at most (and one line). */
const PAGE_LINES = 1000;
const PAGE_BYTES = 1024 * 1024;
/** Characters gathered into one enqueued chunk. */
const PULL_CHARS = 64 * 1024;

/** What the control API needs from `serve`. */
interface ControlApiOptions {
  runner: RunnerService;
  logs: JobLogStore;
  secret: string;
  adminToken: string;
  /** The runner URL as VMs reach it. */
  runnerUrl: string;
  /**
   * The depot URL as VMs reach it, read when a job is created: a job allowed to publish
   * gets it and its depot credentials in its environment (`RUNNER_DEPOT_URL`, `RUNNER_DEPOT_TOKEN`).
   */
  depotUrl?: () => string;
  /**
   * The single-file agents serve published in its depot, by platform (filled once they are):
   * a job's cloud-init then fetches its platform's agent instead of running an installed one.
   */
  agents?: () => ReadonlyMap<string, CloudInitAgent>;
  /**
   * `?follow` responses open at once; more answer RESOURCE_EXHAUSTED. Each costs the fan-out
   * ~2.5 µs a line, so 500 followers of a busy job were more work than storing it; default 64.
   */
  maxFollowers?: number;
  /** Mints a one-time console login URL (`POST /-/console-url`, for `runner-depot console-url`). */
  consoleLoginUrl?: () => string;
  /** One retention pass over the depot (`POST /-/retention`, for `runner-depot retention`). */
  retention?: (policy: RetentionPolicy, dryRun: boolean) => Promise<RetentionReport>;
}

/** Default of ControlApiOptions.maxFollowers. */
export const DEFAULT_MAX_FOLLOWERS = 64;

/** The body of `POST /-/jobs`. */
interface CreateJobRequest {
  command: string[];
  repoUrl?: string;
  commitSha?: string;
  /** Package-name patterns the job may publish with its own credentials (issue 26). */
  publish?: string[];
  /** The job's secret values (docs/runner-protocol.md §14): masked by its agent and by the service. */
  secrets?: string[];
  /** The VM's platform, for the agent it fetches. Default linux-x64. */
  platform?: string;
}

/** Patterns one job may be allowed, and their longest. */
const MAX_PUBLISH_PATTERNS = 64;
const PUBLISH_PATTERN = /^[A-Za-z0-9._*?-]{1,128}$/;

/** The answer of `POST /-/jobs`. */
export interface CreateJobResponse {
  requestId: string;
  token: string;
  endpoint: string;
  userData: string;
  /** The agent the user data fetches (absent: it runs an installed `runner-depot agent`). */
  agent?: CloudInitAgent;
  /** What will not work in a VM, e.g. a loopback endpoint. */
  warnings: string[];
}

/** Builds the control API's fetch handler. */
export function createControlApi(options: ControlApiOptions): (request: Request) => Promise<Response> {
  const expected = Buffer.from(`Bearer ${options.adminToken}`);
  const maxFollowers = options.maxFollowers ?? DEFAULT_MAX_FOLLOWERS;
  let followers = 0;
  return async (request) => {
    try {
      const given = Buffer.from(request.headers.get("authorization") ?? "");
      if (given.length !== expected.length || !timingSafeEqual(given, expected)) {
        throw new RunnerDepotError(
          "UNAUTHENTICATED",
          "the control API needs the admin token (Authorization: Bearer …)",
        );
      }
      const url = new URL(request.url);
      if (request.method === "POST" && url.pathname === "/-/jobs") return await createJob(await jobRequest(request));
      if (request.method === "GET" && url.pathname === "/-/jobs") return await listJobsRoute(options.runner, url);
      if (request.method === "POST" && url.pathname === "/-/console-url" && options.consoleLoginUrl)
        return Response.json(
          { url: options.consoleLoginUrl() },
          { status: 201, headers: { "cache-control": "no-store" } },
        );
      if (request.method === "POST" && url.pathname === "/-/retention" && options.retention)
        return await retentionRoute(request, options.retention);
      const cancel = /^\/-\/jobs\/([^/]+)\/cancel$/.exec(url.pathname);
      if (request.method === "POST" && cancel) return await cancelJobRoute(options.runner, options.logs, cancel[1]!);
      const search = /^\/-\/jobs\/([^/]+)\/search$/.exec(url.pathname);
      if (request.method === "GET" && search) return await searchLog(search[1]!, url);
      const match = /^\/-\/jobs\/([^/]+)\/log$/.exec(url.pathname);
      if (request.method === "GET" && match)
        return await jobLog(match[1]!, url.searchParams.has("follow"), request, url.searchParams.get("section"));
      const sections = /^\/-\/jobs\/([^/]+)\/sections$/.exec(url.pathname);
      if (request.method === "GET" && sections) return await jobSectionsRoute(options.logs, sections[1]!);
      throw new RunnerDepotError("NOT_FOUND", `no control route ${request.method} ${url.pathname}`);
    } catch (error) {
      const problem = RunnerDepotError.from(error).toProblem();
      return Response.json(problem, {
        status: problem.status,
        headers: { "content-type": "application/problem+json" },
      });
    }
  };

  async function createJob(body: unknown): Promise<Response> {
    if (typeof body !== "object" || body === null) throw new RunnerDepotError("INVALID_ARGUMENT", "a job is an object");
    const job = body as Partial<CreateJobRequest>;
    if (
      !Array.isArray(job.command) ||
      job.command.length === 0 ||
      !job.command.every((part) => typeof part === "string")
    ) {
      throw new RunnerDepotError("INVALID_ARGUMENT", "command must be a non-empty array of strings");
    }
    const publish = job.publish ?? [];
    if (
      !Array.isArray(publish) ||
      publish.length > MAX_PUBLISH_PATTERNS ||
      !publish.every((p) => typeof p === "string" && PUBLISH_PATTERN.test(p))
    )
      throw new RunnerDepotError(
        "INVALID_ARGUMENT",
        `publish must be at most ${MAX_PUBLISH_PATTERNS} package-name patterns (letters, digits, . _ - * ?)`,
      );
    const secrets = job.secrets ?? [];
    if (!Array.isArray(secrets) || !secrets.every((s) => typeof s === "string"))
      throw new RunnerDepotError("INVALID_ARGUMENT", "secrets must be an array of strings");
    const requestId = randomUUID();
    const token = mintJobToken(options.secret, requestId);
    const repoUrl = job.repoUrl ?? "";
    const commitSha = job.commitSha ?? "";
    // A job allowed to publish finds the depot and its own credentials in its environment.
    const env =
      publish.length > 0 && options.depotUrl
        ? { RUNNER_DEPOT_URL: options.depotUrl(), RUNNER_DEPOT_TOKEN: `job.${requestId}.${token}` }
        : undefined;
    const platform = job.platform ?? "linux-x64";
    const agents = options.agents?.();
    const agent = agents?.get(platform);
    if (job.platform !== undefined && !agent)
      throw new RunnerDepotError(
        "INVALID_ARGUMENT",
        `no agent for platform ${String(job.platform)} in this depot (has: ${[...(agents?.keys() ?? [])].join(", ") || "none"})`,
      );
    const warnings: string[] = [];
    // Rendered before the job is registered: a refusal leaves no job to be lost.
    // The declared secrets, and a publishing job's depot token: scripts print their environment,
    // so it is masked in the VM and again in the service.
    const masked = env ? [...secrets, token] : secrets;
    const userData = renderCloudInit({
      endpoint: options.runnerUrl,
      requestId,
      token,
      repoUrl,
      commitSha,
      command: job.command,
      ...(env ? { env } : {}),
      agent,
      ...(masked.length > 0 ? { secrets: masked } : {}),
      onWarning: (message) => warnings.push(message),
    });
    await options.runner.expectJob(requestId, {
      repoUrl,
      commitSha,
      ...(publish.length > 0 ? { publish } : {}),
      ...(masked.length > 0 ? { secrets: masked } : {}),
    });
    const answer: CreateJobResponse = { requestId, token, endpoint: options.runnerUrl, userData, warnings };
    if (agent) answer.agent = agent;
    return Response.json(answer, { status: 201 });
  }

  /** `GET /-/jobs/<id>/search?q=&regex=1&case=1&from=&limit=`: a page of matching lines (docs/decisions/log-search.md). */
  async function searchLog(rawId: string, url: URL): Promise<Response> {
    const search = searchRequestOf(url.searchParams);
    const requestId = requestIdOf(rawId);
    return Response.json(await searchJobLog(options.logs, requestId, search), {
      headers: { "cache-control": "no-store" },
    });
  }

  async function jobLog(rawId: string, follow: boolean, request: Request, section: string | null): Promise<Response> {
    const signal = request.signal;
    const requestId = requestIdOf(rawId);
    const state = await options.logs.get(requestId);
    if (!state) throw new RunnerDepotError("NOT_FOUND", `no job ${requestId}`);
    if (follow && section !== null)
      throw new RunnerDepotError(
        "INVALID_ARGUMENT",
        "?section reads a stored section; it does not combine with ?follow",
      );
    // The section's lines (docs/decisions/log-sections.md), or all of them; O(sections) to find it.
    const range = await sectionLines(options.logs, requestId, state.storedLines, section);
    if (follow && followers >= maxFollowers)
      throw new RunnerDepotError(
        "RESOURCE_EXHAUSTED",
        `${maxFollowers} job logs are being followed already; read without ?follow or retry later`,
      );
    if (follow) followers++;
    const encoder = new TextEncoder();
    const { runner, logs } = options;
    const stop = new AbortController();
    // The client going away ends the follow (and frees its slot) even if nobody pulls again.
    const onAbort = () => release();
    signal.addEventListener("abort", onAbort, { once: true });
    // Follow: the fan-out's iterator. Otherwise: the store read a page at a time (O(page) a pull).
    const lines: AsyncIterator<StoredLine> = follow
      ? runner.follow(requestId, { signal: stop.signal })[Symbol.asyncIterator]()
      : // The lines stored when the request came (a page short by its byte bound is not the end, so a job that keeps
        // logging would otherwise be chased); ?follow is for what comes after.
        pages(logs, requestId, range.from, section === null ? state.storedLines : range.to);
    let done = false;
    // The server's request signal does not follow the socket: a follower that left while the
    // job is silent is noticed here, once a second, and frees its slot.
    const gone = follow ? setInterval(() => clientGone(request) && release(), 1000) : null;
    gone?.unref();
    const release = () => {
      if (done) return;
      done = true;
      if (gone !== null) clearInterval(gone);
      if (follow) followers--;
      stop.abort();
      signal.removeEventListener("abort", onAbort);
      void lines.return?.(undefined)?.catch(() => undefined);
    };
    // NDJSON: one {line, stderr} per stored line, then {result} once the job has ended.
    // Pull-driven with a byte high-water mark: a client that stops reading stops the store
    // reads too (the stream asks for more only while its queue is under 64 KiB), so serve
    // holds O(one page) per stalled client instead of the whole log.
    const body = new ReadableStream<Uint8Array>(
      {
        async pull(controller) {
          try {
            let text = "";
            while (text.length < PULL_CHARS) {
              const next = await lines.next();
              if (next.done) {
                const after = await logs.get(requestId);
                if (after?.result) text += `${JSON.stringify({ result: after.result })}\n`;
                if (text) controller.enqueue(encoder.encode(text));
                controller.close();
                release();
                return;
              }
              text += `${JSON.stringify(next.value)}\n`;
              // A follower at the live end waits for the next line: send what we have first.
              if (follow) break;
            }
            controller.enqueue(encoder.encode(text));
          } catch (error) {
            release();
            controller.error(error);
          }
        },
        cancel() {
          release();
        },
      },
      new ByteLengthQueuingStrategy({ highWaterMark: 64 * 1024 }),
    );
    return new Response(body, { headers: { "content-type": "application/x-ndjson", "cache-control": "no-store" } });
  }
}

/** The stored log a line at a time, read a page (PAGE_LINES, PAGE_BYTES) at a time, only when asked. */
async function* pages(logs: JobLogStore, requestId: string, from: number, to: number): AsyncGenerator<StoredLine> {
  for await (const page of logPages(logs, requestId, from, to, { lines: PAGE_LINES, maxBytes: PAGE_BYTES }))
    yield* page;
}

/** A job request's bytes at most: room for its command, patterns and secrets (≤ 256 KiB of them, §14). */
const CREATE_JOB_BYTES = 1024 * 1024;

/** The largest `POST /-/retention` body: a policy is four small members. */
const RETENTION_BYTES = 4096;

/**
 * `POST /-/retention` `{ keepLast?, prereleaseDays?, unusedDays?, dryRun? }`: one pass (src/depot/store/retention.ts),
 * answered with its report (200). A pass pages over every package: O(packages + versions) reads.
 */
async function retentionRoute(
  request: Request,
  retention: (policy: RetentionPolicy, dryRun: boolean) => Promise<RetentionReport>,
): Promise<Response> {
  const { bytes } = await readBounded(request, "POST /-/retention", { maxBytes: RETENTION_BYTES, idleMs: 30_000 });
  let body: Record<string, unknown>;
  try {
    body = JSON.parse(bytes.toString("utf8")) as Record<string, unknown>;
  } catch {
    throw new RunnerDepotError("INVALID_ARGUMENT", "the retention request is not JSON");
  }
  if (typeof body !== "object" || body === null || Array.isArray(body))
    throw new RunnerDepotError("INVALID_ARGUMENT", "a retention request is an object");
  const policy: RetentionPolicy = {};
  for (const key of ["keepLast", "prereleaseDays", "unusedDays"] as const) {
    const value = body[key];
    if (value === undefined) continue;
    if (typeof value !== "number") throw new RunnerDepotError("INVALID_ARGUMENT", `${key} must be a number`);
    policy[key] = value;
  }
  if (body.dryRun !== undefined && typeof body.dryRun !== "boolean")
    throw new RunnerDepotError("INVALID_ARGUMENT", "dryRun must be true or false");
  return Response.json(await retention(policy, body.dryRun === true), { headers: { "cache-control": "no-store" } });
}

/** `POST /-/jobs`'s JSON body, read within CREATE_JOB_BYTES and 30 s idle. O(body). */
async function jobRequest(request: Request): Promise<unknown> {
  const { bytes } = await readBounded(request, "POST /-/jobs", { maxBytes: CREATE_JOB_BYTES, idleMs: 30_000 });
  try {
    return JSON.parse(bytes.toString("utf8")) as unknown;
  } catch {
    throw new RunnerDepotError("INVALID_ARGUMENT", "the job request is not JSON");
  }
}
