/**
 * The packager API of the depot router (docs/depot-api.md §Packager API): a transaction
 * opened, filled with additions, summarised, given requirements, then committed or
 * abandoned, each step on behalf of the principal that opened it.
 */
import type { IRequest } from "itty-router";
import { RunnerDepotError } from "../../errors.js";
import { traceContextOf } from "../../telemetry.js";
import { parseHttpDigest } from "../package/digest.js";
import type { TreeEntry } from "../package/links.js";
import { decodeSegment, isLicenseName, parsePackageRef } from "../package/names.js";
import { clientGone } from "./native-body.js";
import { failSpan, type CommitOutcome } from "./telemetry.js";
import { parseItemPath } from "../package/paths.js";
import { json } from "./problem-response.js";
import { keys, type TransactionRecord, type VersionRecord } from "../store/records.js";
import { recoverCommit } from "../transactions/recovery.js";
import { parseAttributes, parseMode, parseRequirements, requireEmpty, single } from "./request-headers.js";
import { getAndHead, type RouterContext } from "./router-context.js";
import { pagedJson, pageOfCommitted, summaryItems, summaryPage, type ManifestHint } from "../transactions/summary.js";
import { uploadBody } from "../transactions/upload-body.js";
import { parseYankReason, setYank } from "../catalog/yank.js";

/** Registers the packager routes on `context.router`. */
export function registerPackagerRoutes(context: RouterContext): void {
  const {
    router,
    store,
    base,
    now,
    telemetry,
    log,
    transactions,
    additions,
    commits,
    linkTo,
    principalOf,
    referenceAccess,
  } = context;

  router.post("/trans/:pkg", async (request) => {
    const ref = parsePackageRef(request.params.pkg!);
    if (ref.version === undefined)
      throw new RunnerDepotError("VERSION_INVALID", "POST /trans/<name>@<version> needs the version");
    const principal = await principalOf(request, "publish", ref.name);
    const trans = await transactions.open(ref.name, ref.version, principal);
    telemetry.transactionDelta(1);
    log.info({ transaction: trans.id, name: trans.name, version: trans.version }, "transaction opened");
    return json(
      201,
      { transaction: trans.id, expiresAt: transactions.expiresAt(trans).toISOString() },
      { Location: `${base}/summary/${trans.id}` },
    );
  });

  /** Loads a transaction on behalf of the request's principal. */
  async function transactionFor(request: IRequest, allowCommitted = false): Promise<TransactionRecord> {
    const id = decodeSegment(request.params.id!);
    // Auth first when we can: a request without credentials learns nothing about the id.
    if (context.authorize) await principalOf(request, "publish");
    // One read of the record: its package name for the auth hook (none for a gone one, which
    // answers 410 to whoever may publish at all), then the principal and state checks.
    let trans = await transactions.read(id);
    const principal = await principalOf(request, "publish", transactions.isGone(trans) ? undefined : trans.name);
    // A commit whose process died is settled now, not after its lease (depot/transactions/recovery.ts).
    if (trans.state === "committing" && trans.principal === principal)
      trans = (await recoverCommit(store, transactions, trans.id, now)) ?? trans;
    const active = trans.state === "open" || trans.state === "committing";
    try {
      return await transactions.check(trans, principal, allowCommitted);
    } catch (error) {
      // check() moves a live transaction past its expiry to `expired` before it refuses.
      if (active && error instanceof RunnerDepotError && error.code === "TRANSACTION_EXPIRED") {
        telemetry.transactionDelta(-1);
        log.info({ transaction: trans.id, name: trans.name, version: trans.version }, "transaction expired");
      }
      throw error;
    }
  }

  // Yank (docs/depot-api.md §Yank): POST marks name@version with Pkg-Reason, DELETE takes the mark back.
  const yankHandler = async (request: IRequest) => {
    const ref = parsePackageRef(request.params.pkg!);
    if (ref.version === undefined)
      throw new RunnerDepotError("VERSION_INVALID", "/yank/<name>@<version> needs the version");
    await principalOf(request, "publish", ref.name);
    requireEmpty(request);
    const reason = request.method === "DELETE" ? null : parseYankReason(single(request.headers, "pkg-reason", true));
    const outcome = await setYank(store, ref.name, ref.version, reason, now());
    log.info({ name: ref.name, version: ref.version, yanked: outcome.yanked !== null }, "yank set");
    return json(200, { name: outcome.name, version: outcome.version, yanked: outcome.yanked });
  };
  router.post("/yank/:pkg", yankHandler);
  router.delete("/yank/:pkg", yankHandler);

  router.delete("/trans/:id", async (request) => {
    const trans = await transactionFor(request);
    await transactions.abandon(trans);
    telemetry.transactionDelta(-1);
    log.info({ transaction: trans.id, name: trans.name, version: trans.version }, "transaction abandoned");
    return new Response(null, { status: 204 });
  });

  /** Upload bytes read, counted once per body as it ends. */
  const countIn = (_request: IRequest) => (bytes: number) => telemetry.bytesRead(bytes);

  router.post("/add/:id/:type", async (request) => {
    const type = request.params.type!;
    if (!["file", "dir", "link", "license", "set"].includes(type)) {
      throw new RunnerDepotError(
        "TYPE_INVALID",
        `Unknown item type ${JSON.stringify(type.slice(0, 40))}: file, dir, link, license or set`,
      );
    }
    const trans = await transactionFor(request);
    const headers = request.headers;
    let result: Record<string, unknown>;
    switch (type) {
      case "file": {
        const path = parseItemPath(single(headers, "pkg-path", true));
        const mode = parseMode(headers.get("pkg-mode"), 0o644);
        const digest = parseHttpDigest(headers.get("content-digest"));
        result = await additions.addFile(
          trans,
          path,
          mode,
          await uploadBody(request, countIn(request)),
          digest,
          referenceAccess(request),
        );
        break;
      }
      case "dir": {
        requireEmpty(request);
        const path = parseItemPath(single(headers, "pkg-path", true));
        result = await additions.addDir(trans, path, parseMode(headers.get("pkg-mode"), 0o755));
        break;
      }
      case "link": {
        requireEmpty(request);
        const path = parseItemPath(single(headers, "pkg-path", true));
        result = await additions.addLink(trans, path, single(headers, "pkg-target", true));
        break;
      }
      case "license": {
        const license = single(headers, "pkg-license", false);
        if (!isLicenseName(license)) {
          throw new RunnerDepotError(
            "HEADER_INVALID",
            `Pkg-License ${JSON.stringify(license.slice(0, 80))} is not a licence name (letters, digits, '.', '+', '-')`,
          );
        }
        const digest = parseHttpDigest(headers.get("content-digest"));
        result = await additions.addLicense(
          trans,
          license,
          await uploadBody(request, countIn(request)),
          digest,
          referenceAccess(request),
        );
        break;
      }
      default: {
        requireEmpty(request);
        result = await transactions.setAttributes(trans, parseAttributes(headers));
      }
    }
    return json(201, result);
  });

  /** Where the next summary page of a committed version starts in its manifest (summary.ts, pageOfCommitted). */
  const manifestHints = new Map<string, ManifestHint>();
  getAndHead(router, "/summary/:id", async (request) => {
    const trans = await transactionFor(request, true);
    const page = summaryPage(request);
    if (trans.state === "committed") {
      // The page is read from the manifest blob up to its end, never the whole: O(limit) along `next` (summary.ts).
      const version = (await store.getRecord<VersionRecord>(keys.version(trans.name, trans.version)))?.value;
      const committed = await pageOfCommitted(store, version?.manifest, page, manifestHints);
      const { items, next, licenses } = committed ?? { items: [], next: null, licenses: [] };
      return pagedJson(request, next, {
        ...summaryHead(trans),
        url: linkTo(trans.result!.location),
        digest: trans.result!.digest,
        items,
        next,
        licenses,
        totals: { items: trans.itemCount, bytes: trans.bytes },
        problems: [],
      });
    }
    // The touch hands back the record it wrote; a read only when it could not touch.
    const fresh = (await transactions.touch(trans.id)) ?? (await transactions.load(trans.id, trans.principal));
    const { items, next } = await summaryItems(store, fresh, page);
    // The problems of this page's items, each judged against the whole tree as stored; the
    // licences' on the first page. The commit checks everything again.
    const seen = new Map<string, Promise<TreeEntry | undefined>>();
    const tree = (p: string) => seen.get(p) ?? seen.set(p, additions.entryAt(fresh, p)).get(p)!; // each path read once per page
    const marks = new Map<string, Promise<boolean>>();
    const below = (d: string) => marks.get(d) ?? marks.set(d, additions.holdsItems(fresh, d)).get(d)!;
    const problems = await commits.validate(fresh, items, { tree, below, licenses: page.after === undefined });
    return pagedJson(request, next, {
      ...summaryHead(fresh),
      items,
      next,
      licenses: Object.entries(fresh.licenses).map(([name, l]) => ({ name, size: l.size, digest: l.digest })),
      totals: { items: fresh.itemCount, bytes: fresh.bytes },
      problems,
    });
  });

  function summaryHead(trans: TransactionRecord) {
    return {
      transaction: trans.id,
      name: trans.name,
      version: trans.version,
      state: trans.state,
      createdAt: trans.createdAt,
      expiresAt: transactions.expiresAt(trans).toISOString(),
      requires: trans.requires,
      attributes: trans.attributes,
    };
  }

  router.post("/meta/:id/require", async (request) => {
    const trans = await transactionFor(request);
    return json(201, { requires: await transactions.require(trans, parseRequirements(request.headers)) });
  });

  // A commit under a `depot.commit` span; its latency by outcome, a publish counted once.
  router.post("/commit/:id", async (request) => {
    const started = performance.now();
    const id = decodeSegment(request.params.id!);
    const span = telemetry.startSpan("depot.commit", traceContextOf(request.headers), { "depot.transaction": id });
    let outcome: CommitOutcome = "failed";
    try {
      const trans = await transactionFor(request, true);
      span.setAttributes({ "depot.package": trans.name, "depot.version": trans.version });
      // A retry meeting a live claim may wait up to 30 s: it stops once its client is gone.
      const { result, first } = await commits.commit(trans, { clientGone: () => clientGone(request) });
      outcome = first ? "published" : "repeated";
      if (first) telemetry.transactionDelta(-1);
      log.info(
        { transaction: id, name: result.name, version: result.version, digest: result.digest },
        first ? "version published" : "commit repeated",
      );
      span.setAttribute("depot.digest", result.digest);
      // Provenance is signed before the answer, so a client reading it next finds it.
      if (first) await context.published?.(result.name, result.version, trans.principal);
      span.end();
      const url = linkTo(result.location);
      return json(
        first ? 201 : 200,
        { url, name: result.name, version: result.version, digest: result.digest },
        { Location: `${base}${result.location}` },
      );
    } catch (error) {
      if (error instanceof RunnerDepotError && error.status < 500) {
        outcome = "refused";
        log.info({ transaction: id, code: error.code }, "commit refused");
      }
      failSpan(span, error);
      throw error;
    } finally {
      telemetry.committed(outcome, (performance.now() - started) / 1000);
    }
  });
}
