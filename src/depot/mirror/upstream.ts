/**
 * The mirror's reads of an upstream depot, each bounded in bytes and time (the upstream may be
 * hostile): feed pages, a version's listing, byte ranges of its archive. Nothing here writes.
 * Why: docs/decisions/depot-yank-mirror.md, "upstream.ts".
 */
import { isRunnerDepotError, RunnerDepotError } from "../../errors.js";
import { readBounded, readJson, timedChunks } from "../client/body.js";
import { MAX_ATTESTATIONS } from "../store/attestations.js";

/** Bounds of the mirror's reads. */
export interface UpstreamLimits {
  /** Largest JSON answer (a feed page, a version listing). */
  maxJsonBytes: number;
  /** Largest manifest accepted (the archive's first entry). */
  maxManifestBytes: number;
  /** The longest wait for an answer's head, and for the next chunk of any answer, ms. */
  idleMs: number;
  /** The longest a JSON answer may take, head included, ms. */
  jsonMs: number;
  /** Largest `GET /attestations` answer (up to 16 bundles, as JSON). */
  maxAttestationBytes: number;
}

export const UPSTREAM_LIMITS: UpstreamLimits = {
  maxJsonBytes: 16 * 2 ** 20,
  maxManifestBytes: 64 * 2 ** 20,
  idleMs: 30_000,
  jsonMs: 120_000,
  maxAttestationBytes: 64 * 2 ** 20,
};

/** One entry of the upstream's `changes`. */
export interface FeedChange {
  position: number;
  name: string;
  version: string;
  yanked?: string | null;
  /** On an attestation entry: the digest of the bundle added to the version. */
  attested?: string;
  /** On a removal entry (the upstream's retention removed the version). */
  removed?: true;
}

/** A `GET /catalog?since=` answer, reduced to what a mirror uses. */
export interface FeedPage {
  position: number;
  changes: FeedChange[];
  more: boolean;
}

/** A version as `GET /version/<name>@<version>` lists it. */
export interface UpstreamVersion {
  version: string;
  publishedAt: string;
  digest: string;
  size: number;
  yanked?: { reason: string; at: string };
}

/** A version as `GET /mirror/feed` details it: the listing and the manifest's exact text. */
export interface BatchVersion {
  publishedAt: string;
  digest: string;
  size: number;
  manifest: string;
}

/** A `GET /mirror/feed` answer: a feed page with its new versions' listings and manifests. */
export interface BatchFeedPage extends FeedPage {
  versions: Map<string, BatchVersion>;
}

/** Changes per feed page: keeps a page's package states (each up to 4,000 versions) within maxJsonBytes. */
const FEED_PAGE = 100;

/** An error answer's body is read only for its problem code: at most this many bytes, within this many ms in all. */
const ERROR_BODY = 64 * 1024;
const ERROR_BODY_MS = 5_000;

/** An upstream depot at `url`, read with `token` when given. */
export class Upstream {
  readonly url: string;
  constructor(
    url: string,
    private readonly token: string | undefined,
    /** The bounds on what is read from the upstream. */
    readonly limits: UpstreamLimits = UPSTREAM_LIMITS,
    private readonly signal?: AbortSignal,
  ) {
    this.url = url.replace(/\/+$/, "");
  }

  /**
   * One request whose answer must begin within `headMs`: undici alone waits 300 s for a head, and a stalled
   * upstream would hold a pull slot or a mirror run that long. Past the bound the request is aborted with
   * DEADLINE_EXCEEDED (the code of the body bounds, depot/client/body.ts); the caller's signal still aborts it.
   */
  private async request(method: string, path: string, init: RequestInit, headMs: number): Promise<Response> {
    const what = `${method} ${path}`;
    const headers = new Headers(init.headers);
    if (this.token) headers.set("Authorization", `Bearer ${this.token}`);
    const late = `upstream ${this.url}: ${what}: no answer in ${headMs / 1000} s`;
    const details = { timeout: "head", ms: headMs };
    const head = new AbortController();
    const timer = setTimeout(() => head.abort(new RunnerDepotError("DEADLINE_EXCEEDED", late, { details })), headMs);
    const signal = this.signal ? AbortSignal.any([this.signal, head.signal]) : head.signal;
    try {
      return await fetch(`${this.url}${path}`, { ...init, method, headers, signal });
    } catch (cause) {
      if (this.signal?.aborted) throw cause;
      if (head.signal.aborted) throw head.signal.reason as RunnerDepotError;
      throw new RunnerDepotError("UNAVAILABLE", `upstream ${this.url}: ${what} failed`, { cause });
    } finally {
      // Only the head is bounded here: the body's bounds are the reader's (timedChunks).
      clearTimeout(timer);
    }
  }

  /** A GET whose head comes within the idle bound (`headMs`: a smaller one). */
  private get(path: string, headers: Record<string, string> = {}, headMs = this.limits.idleMs): Promise<Response> {
    return this.request("GET", path, { headers }, headMs);
  }

  /**
   * A JSON answer of `path`: its head within `idleMs`, then `read` (its body as JSON, at most `maxBytes`) or `fail`
   * (its error), all within `jsonMs` of the request's start, the body silent at most `idleMs` at a time.
   */
  private async jsonAnswer<T>(
    path: string,
    maxBytes: number,
    headers: Record<string, string> = {},
  ): Promise<{ response: Response; read: () => Promise<T>; fail: () => Promise<RunnerDepotError> }> {
    const started = Date.now();
    const response = await this.get(path, headers, Math.min(this.limits.idleMs, this.limits.jsonMs));
    const left = () => Math.max(0, this.limits.jsonMs - (Date.now() - started));
    const what = `GET ${path}`;
    return {
      response,
      fail: () => this.refusal(response, what, left()),
      read: async () => {
        try {
          return await readJson<T>(response, what, { maxBytes, idleMs: this.limits.idleMs, totalMs: left() });
        } catch (error) {
          // The body's share of jsonMs is what is left after the head: name the whole bound, not that share.
          if (isRunnerDepotError(error) && error.code === "DEADLINE_EXCEEDED" && error.details.timeout === "total")
            throw new RunnerDepotError(
              "DEADLINE_EXCEEDED",
              `${what}: the answer took longer than ${this.limits.jsonMs / 1000} s`,
              { details: { timeout: "total", ms: this.limits.jsonMs } },
            );
          throw error;
        }
      },
    };
  }

  private async json<T>(path: string, maxBytes = this.limits.maxJsonBytes): Promise<T> {
    const answer = await this.jsonAnswer<T>(path, maxBytes);
    if (answer.response.status !== 200) throw await answer.fail();
    return answer.read();
  }

  /**
   * The error of a non-success answer: its status, with the problem code its body names when the body comes
   * within ERROR_BODY bytes and ERROR_BODY_MS in all (capped by the idle bound and `leftMs`). The body is only read
   * for that code, so one that drips or stalls is dropped and the status stands alone.
   */
  private async refusal(response: Response, what: string, leftMs = Infinity): Promise<RunnerDepotError> {
    const ms = Math.min(ERROR_BODY_MS, this.limits.idleMs, leftMs);
    let bytes: Buffer = Buffer.alloc(0);
    try {
      ({ bytes } = await readBounded(response, what, { maxBytes: ERROR_BODY, idleMs: ms, totalMs: ms }, true));
    } catch (error) {
      if (this.signal?.aborted) throw error;
    }
    return upstreamError(response.status, what, bytes);
  }

  /** The changes after `since`. O(FEED_PAGE). */
  async feed(since: number): Promise<FeedPage> {
    const body = await this.json<unknown>(`/catalog?since=${since}&limit=${FEED_PAGE}`);
    return parseFeedPage(body, since, FEED_PAGE);
  }

  /**
   * `GET /mirror/feed?since=`: a feed page with each new version's listing and manifest, or null from an upstream
   * without the route (404 or 405: a depot before it), which the mirror then reads version by version. O(FEED_PAGE).
   */
  async batchFeed(since: number): Promise<BatchFeedPage | null> {
    const path = `/mirror/feed?since=${since}&limit=${FEED_PAGE}`;
    const answer = await this.jsonAnswer<Record<string, unknown>>(path, this.limits.maxJsonBytes, {
      "Accept-Encoding": "gzip",
    });
    const { response } = answer;
    if (response.status === 404 || response.status === 405) {
      void response.body?.cancel().catch(() => undefined);
      return null;
    }
    if (response.status !== 200) throw await answer.fail();
    const body = await answer.read();
    const page = parseFeedPage(body, since, FEED_PAGE);
    const versions = new Map<string, BatchVersion>();
    const raw = (typeof body.versions === "object" && body.versions !== null ? body.versions : {}) as Record<
      string,
      Record<string, unknown>
    >;
    for (const change of page.changes) {
      const key = `${change.name}@${change.version}`;
      const v = Object.hasOwn(raw, key) ? raw[key] : undefined;
      if (
        v &&
        typeof v.publishedAt === "string" &&
        typeof v.digest === "string" &&
        /^sha256:[0-9a-f]{64}$/.test(v.digest) &&
        Number.isSafeInteger(v.size) &&
        (v.size as number) >= 0 &&
        typeof v.manifest === "string" &&
        v.manifest.length <= this.limits.maxManifestBytes
      )
        versions.set(key, v as unknown as BatchVersion);
    }
    // `more` is the upstream's word here (a page may end short of the head), but only from a page that moved: a page
    // with changes ends past `since`, and one without must still end past it, or the mirror would ask again for ever.
    const more = body.more === true;
    if (more && page.position <= since)
      throw new RunnerDepotError(
        "UNAVAILABLE",
        `upstream ${this.url}: GET ${path} says more but moves nothing past position ${since}`,
      );
    return { ...page, more, versions };
  }

  /**
   * `POST /mirror/blobs`: the bytes of `blobs` (each an item or licence of the version named), concatenated in order,
   * each piece exactly its size: `take(n)` yields the next n bytes. UNAVAILABLE when the answer is short.
   */
  async blobs(blobs: ReadonlyArray<{ ref: string; digest: string; size: number }>) {
    const response = await this.request(
      "POST",
      "/mirror/blobs",
      {
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ blobs: blobs.map((b) => [b.ref, b.digest]) }),
      },
      this.limits.idleMs,
    );
    if (response.status !== 200) throw await this.refusal(response, "POST /mirror/blobs");
    if (!response.body)
      throw new RunnerDepotError("UNAVAILABLE", `upstream ${this.url}: POST /mirror/blobs without a body`);
    return new Pieces(
      timedChunks(response.body, "POST /mirror/blobs", { idleMs: this.limits.idleMs })[Symbol.asyncIterator](),
      this.url,
    );
  }

  /** One version's listing. */
  async version(name: string, version: string): Promise<UpstreamVersion> {
    const body = await this.json<{ versions?: unknown }>(`/version/${name}@${encodeURIComponent(version)}`);
    const entry = Array.isArray(body.versions) ? (body.versions[0] as Record<string, unknown> | undefined) : undefined;
    if (
      !entry ||
      entry.version !== version ||
      typeof entry.publishedAt !== "string" ||
      typeof entry.digest !== "string" ||
      !/^sha256:[0-9a-f]{64}$/.test(entry.digest) ||
      !Number.isSafeInteger(entry.size) ||
      (entry.size as number) < 0
    )
      throw new RunnerDepotError("UNAVAILABLE", `upstream ${this.url}: no valid listing of ${name}@${version}`);
    const yanked = entry.yanked as { reason?: unknown; at?: unknown } | undefined;
    const valid =
      typeof yanked?.reason === "string" && typeof yanked.at === "string" && !Number.isNaN(Date.parse(yanked.at));
    const { publishedAt, digest, size } = entry as unknown as UpstreamVersion;
    const out: UpstreamVersion = { version, publishedAt, digest, size };
    if (valid) out.yanked = { reason: yanked.reason as string, at: new Date(yanked.at as string).toISOString() };
    return out;
  }

  /** The newest version the upstream resolves `name` to (its `latest`). */
  async latest(name: string): Promise<string> {
    const body = await this.json<{ latest?: unknown }>(`/version/${name}?limit=1`);
    if (typeof body.latest !== "string" || body.latest.length === 0 || body.latest.length > 256)
      throw new RunnerDepotError("UNAVAILABLE", `upstream ${this.url}: no latest version of ${name}`);
    return body.latest;
  }

  /**
   * The bundles of `name@version`'s attestations, as `GET /attestations` lists them (at most
   * MAX_ATTESTATIONS, bounded by maxAttestationBytes); each still to be checked by the caller.
   */
  async attestations(name: string, version: string): Promise<unknown[]> {
    const path = `/attestations/${name}@${encodeURIComponent(version)}`;
    const body = await this.json<{ attestations?: unknown }>(path, this.limits.maxAttestationBytes);
    if (!Array.isArray(body.attestations) || body.attestations.length > MAX_ATTESTATIONS)
      throw new RunnerDepotError(
        "UNAVAILABLE",
        `upstream ${this.url}: no valid attestation list of ${name}@${version}`,
      );
    return body.attestations.map((a: unknown) => (a as { bundle?: unknown } | null)?.bundle);
  }

  /**
   * Bytes [start, start + length) of `name@version`'s archive: exactly `length` of them, or UNAVAILABLE
   * (an upstream that ignores the range or sends more is cut at `length`). Each chunk within `idleMs`; with
   * `totalMs`, the whole within it too (a structured read; an item's bytes may come slowly while they come).
   */
  async *range(
    name: string,
    version: string,
    start: number,
    length: number,
    totalMs?: number,
  ): AsyncGenerator<Uint8Array> {
    const what = `GET /data/${name}@${version} bytes ${start}-${start + length - 1}`;
    const response = await this.get(`/data/${name}@${encodeURIComponent(version)}`, {
      Range: `bytes=${start}-${start + length - 1}`,
    });
    if (response.status !== 206 || response.headers.get("content-range")?.startsWith(`bytes ${start}-`) !== true) {
      void response.body?.cancel().catch(() => undefined);
      throw new RunnerDepotError("UNAVAILABLE", `upstream ${this.url}: ${what} answered ${response.status}, not 206`);
    }
    let got = 0;
    if (response.body)
      for await (const chunk of timedChunks(response.body, what, { idleMs: this.limits.idleMs, totalMs })) {
        const take = Math.min(chunk.byteLength, length - got);
        if (take > 0) yield chunk.subarray(0, take);
        got += take;
        if (got === length) break;
      }
    if (got !== length)
      throw new RunnerDepotError("UNAVAILABLE", `upstream ${this.url}: ${what} ended after ${got} bytes`);
  }

  /**
   * A small range read whole (a manifest's tar header or text): within `jsonMs` in all, as a JSON answer, so a drip
   * within the idle bound cannot hold a mirror run or a pull-through slot for hours.
   */
  async bytes(name: string, version: string, start: number, length: number): Promise<Buffer> {
    const chunks: Uint8Array[] = [];
    for await (const chunk of this.range(name, version, start, length, this.limits.jsonMs)) chunks.push(chunk);
    return Buffer.concat(chunks);
  }
}

/** A concatenation of blobs, read one piece at a time. */
export class Pieces {
  private held: Uint8Array = new Uint8Array(0);
  constructor(
    private readonly chunks: AsyncIterator<Uint8Array>,
    private readonly url: string,
  ) {}

  /** The next `length` bytes, as chunks; UNAVAILABLE when the answer ends first. */
  async *take(length: number): AsyncGenerator<Uint8Array> {
    let left = length;
    while (left > 0) {
      if (this.held.byteLength === 0) {
        const next = await this.chunks.next();
        if (next.done)
          throw new RunnerDepotError("UNAVAILABLE", `upstream ${this.url}: POST /mirror/blobs ended early`);
        this.held = next.value;
        continue;
      }
      const piece = this.held.subarray(0, left);
      this.held = this.held.subarray(piece.byteLength);
      left -= piece.byteLength;
      yield piece;
    }
  }

  /** Stops reading the answer. */
  async close(): Promise<void> {
    await this.chunks.return?.();
  }
}

/**
 * A feed answer as a mirror may trust it: `position` at or past `since`, every change after `since`
 * and at most `position`, strictly ascending; UNAVAILABLE otherwise. `more` when the page is full. O(changes).
 */
export function parseFeedPage(raw: unknown, since: number, pageSize: number): FeedPage {
  const body = (typeof raw === "object" && raw !== null ? raw : {}) as Record<string, unknown>;
  const position = body.position;
  const changes = body.changes;
  if (!Number.isSafeInteger(position) || (position as number) < since || !Array.isArray(changes))
    throw new RunnerDepotError("UNAVAILABLE", "upstream: a feed page without position or changes");
  if (changes.length > pageSize)
    throw new RunnerDepotError("UNAVAILABLE", "upstream: a feed page with more changes than asked for");
  const checked = changes.map((c: unknown) => checkChange(c, since, position as number));
  for (let i = 1; i < checked.length; i++)
    if (checked[i]!.position <= checked[i - 1]!.position)
      throw new RunnerDepotError("UNAVAILABLE", "upstream: feed changes out of order");
  return { position: position as number, changes: checked, more: checked.length === pageSize };
}

function checkChange(raw: unknown, since: number, upTo: number): FeedChange {
  const c = raw as Record<string, unknown> | null;
  const ok =
    c !== null &&
    typeof c === "object" &&
    Number.isSafeInteger(c.position) &&
    (c.position as number) > since &&
    (c.position as number) <= upTo &&
    typeof c.name === "string" &&
    typeof c.version === "string" &&
    (c.yanked === undefined || c.yanked === null || typeof c.yanked === "string") &&
    (c.attested === undefined || (typeof c.attested === "string" && /^sha256:[0-9a-f]{64}$/.test(c.attested))) &&
    (c.removed === undefined || c.removed === true);
  if (!ok) throw new RunnerDepotError("UNAVAILABLE", "upstream feed: a malformed change entry");
  // Only the members a mirror reads, so nothing else an upstream sends travels on.
  const change: FeedChange = { position: c.position as number, name: c.name as string, version: c.version as string };
  if (c.yanked !== undefined) change.yanked = c.yanked as string | null;
  else if (c.attested !== undefined) change.attested = c.attested as string;
  else if (c.removed === true) change.removed = true;
  return change;
}

function upstreamError(status: number, what: string, bytes: Buffer): RunnerDepotError {
  let detail = "";
  try {
    const problem = JSON.parse(bytes.toString("utf8")) as { code?: unknown };
    if (typeof problem.code === "string") detail = ` ${problem.code.slice(0, 40)}`;
  } catch {
    // not a problem body: the status says enough
  }
  const code = status === 401 || status === 403 ? "PERMISSION_DENIED" : "UNAVAILABLE";
  // `upstreamStatus` lets pull-through tell "the upstream has no such version" (404) from an outage.
  return new RunnerDepotError(code, `upstream: ${what} answered ${status}${detail}`, {
    details: { upstreamStatus: status },
  });
}
