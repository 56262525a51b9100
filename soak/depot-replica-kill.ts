/**
 * Soak: SIGKILL of one of two depot replicas (separate processes on one PostgreSQL schema and
 * one S3 bucket, test/fixtures/depot-replicas.ts) in the middle of commits. Each round
 * prepares several publishes through both replicas in turn (open, add 3 files), fires their
 * commits at one replica (the victim, alternating), kills it after a random moment, sends every
 * unanswered commit again to the surviving replica (as a client behind a load balancer would,
 * retrying a 409 "retry"), and starts the victim again. At the end: every publish is committed
 * (none lost), every listed version downloads whole, each committed digest is the one served,
 * no transaction is stuck in `committing`, and each version is in the change feed exactly once.
 */
import { createHash } from "node:crypto";
import os from "node:os";
import { createTestSchema } from "../test/fixtures/backends.js";
import { httpDigest, storeDigest } from "../test/fixtures/depot.js";
import { freshPrefix, replicaS3, roundRobin, startReplica, type Replica } from "../test/fixtures/depot-replicas.js";

const PUBLISHES_PER_ROUND = 3;
/** Upper bound of the random delay between firing the commits and the kill, in ms. */
const KILL_WINDOW_MS = 300;

interface Publish {
  id: string;
  spec: string;
  /** The digest a commit answered (201, or 200 on a repeat). */
  digest?: string;
}

async function commitOn(url: string, id: string): Promise<{ status: number; digest?: string; code?: string } | null> {
  try {
    const response = await fetch(`${url}/commit/${id}`, { method: "POST" });
    const body = (await response.json()) as { digest?: string; code?: string };
    return { status: response.status, digest: body.digest, code: body.code };
  } catch {
    return null; // the connection died with the replica
  }
}

/** Commits again on `url` until answered 200/201 (a 409 CONFLICT or 503 is "retry"); the last answer. */
async function retryCommit(url: string, id: string): Promise<{ status: number; digest?: string; code?: string }> {
  let last = { status: 0 } as { status: number; digest?: string; code?: string };
  for (let i = 0; i < 100; i++) {
    last = (await commitOn(url, id)) ?? { status: 0 };
    if (last.status === 200 || last.status === 201) return last;
    if (!(last.status === 409 && last.code === "CONFLICT") && last.status !== 503 && last.status !== 0) return last;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return last;
}

/** Every change from position 0, following `Link: rel="next"`. */
async function changeFeed(url: string): Promise<Array<{ name: string; version: string; yanked?: unknown }>> {
  const changes: Array<{ name: string; version: string }> = [];
  let next: string | null = `${url}/catalog?since=0`;
  while (next) {
    const response: Response = await fetch(next);
    if (response.status !== 200) throw new Error(`catalog feed: ${response.status}`);
    changes.push(...(((await response.json()) as { changes?: typeof changes }).changes ?? []));
    const link = /<([^>]+)>;\s*rel="next"/.exec(response.headers.get("link") ?? "");
    next = link ? new URL(link[1]!, url).toString() : null;
  }
  return changes;
}

/** Runs the soak and returns its RELIABILITY.md section. */
export async function run({ scale }: { scale: number }): Promise<string> {
  const rounds = Math.max(3, Math.round(100 * scale));
  const started = Date.now();
  const s3 = await replicaS3();
  const db = await createTestSchema();
  const prefix = await freshPrefix(s3, "soak-replica-kill");
  const replicas: Replica[] = [];
  const publishes: Publish[] = [];
  const lost: string[] = [];
  let killsMidCommit = 0;
  let answeredBeforeKill = 0;
  let retriedOnOther = 0;
  try {
    for (let i = 0; i < 2; i++) replicas.push(await startReplica(s3, db.schema, prefix, { quiet: true }));
    for (let round = 0; round < rounds; round++) {
      const victimAt = round % 2;
      const victim = replicas[victimAt]!;
      const other = replicas[1 - victimAt]!;
      const rr = roundRobin(replicas.map((r) => r.url));
      const batch: Publish[] = [];
      for (let k = 0; k < PUBLISHES_PER_ROUND; k++) {
        const spec = `soak-${k}@1.0.${round}`;
        const opened = await rr.fetch(`/trans/${spec}`, { method: "POST" });
        if (opened.status !== 201) throw new Error(`open ${spec}: ${opened.status} ${await opened.text()}`);
        const id = ((await opened.json()) as { transaction: string }).transaction;
        for (const [path, body] of Object.entries({ "bin/app": `${spec}\n`.repeat(40), etc: spec, doc: "d" })) {
          const added = await rr.fetch(`/add/${id}/file`, { method: "POST", headers: { "Pkg-Path": path }, body });
          if (added.status !== 201) throw new Error(`add ${path} to ${spec}: ${added.status}`);
        }
        batch.push({ id, spec });
      }
      publishes.push(...batch);
      const answers = batch.map(() => undefined as Awaited<ReturnType<typeof commitOn>> | undefined);
      const commits = batch.map((p, i) => commitOn(victim.url, p.id).then((a) => (answers[i] = a)));
      await new Promise((resolve) => setTimeout(resolve, Math.random() * KILL_WINDOW_MS));
      if (answers.some((a) => a === undefined)) killsMidCommit++;
      await victim.kill();
      await Promise.all(commits);
      for (const [i, p] of batch.entries()) {
        const a = answers[i];
        if (a?.status === 201) {
          p.digest = a.digest;
          answeredBeforeKill++;
          continue;
        }
        retriedOnOther++;
        const again = await retryCommit(other.url, p.id);
        if (again.status === 200 || again.status === 201) p.digest = again.digest;
        else lost.push(`${p.spec}: commit again answered ${again.status} ${again.code ?? ""}`);
      }
      replicas[victimAt] = await startReplica(s3, db.schema, prefix, { quiet: true });
    }

    // The whole store, read through the replicas in turn.
    const rr = roundRobin(replicas.map((r) => r.url));
    const stuck: string[] = [];
    const torn: string[] = [];
    const wrongDigest: string[] = [];
    for (const p of publishes) {
      const summary = (await (await rr.fetch(`/summary/${p.id}?limit=1`)).json()) as { state?: string };
      if (summary.state !== "committed") stuck.push(`${p.spec} is ${summary.state}`);
      // The replica answers the bytes itself or a redirect to S3 carrying the archive's
      // Repr-Digest (S3 then serves the bytes): either way the Repr-Digest is the replica's.
      const redirect = await rr.fetch(`/data/${p.spec}`, { redirect: "manual" });
      const location = redirect.headers.get("location");
      if (location) await redirect.arrayBuffer();
      const data = location ? await fetch(location) : redirect;
      const body = new Uint8Array(await data.arrayBuffer());
      const hex = createHash("sha256").update(body).digest("hex");
      if (data.status !== 200 || redirect.headers.get("repr-digest") !== httpDigest(body))
        torn.push(`${p.spec} (HTTP ${data.status}, body sha256:${hex})`);
      else if (p.digest !== undefined && storeDigest(body) !== p.digest)
        wrongDigest.push(`${p.spec}: committed ${p.digest}, served sha256:${hex}`);
    }
    const feed = await changeFeed(replicas[0]!.url);
    const counts = new Map<string, number>();
    for (const c of feed) counts.set(`${c.name}@${c.version}`, (counts.get(`${c.name}@${c.version}`) ?? 0) + 1);
    const notOnce = publishes
      .filter((p) => counts.get(p.spec) !== 1)
      .map((p) => `${p.spec} ${counts.get(p.spec) ?? 0}×`);
    const committed = publishes.filter((p) => p.digest !== undefined).length;
    const holds =
      lost.length === 0 && stuck.length === 0 && torn.length === 0 && wrongDigest.length === 0 && notOnce.length === 0;
    const problems = [
      ...lost.map((l) => `lost: ${l}`),
      ...stuck.map((s) => `stuck: ${s}`),
      ...torn.map((t) => `torn: ${t}`),
      ...wrongDigest.map((w) => `digest: ${w}`),
      ...notOnce.map((n) => `feed: ${n}`),
    ];
    return [
      "## Depot: SIGKILL of one of two replicas during commits (PostgreSQL + S3)",
      "",
      `Method: two depot processes (\`test/fixtures/depot-replica-server.ts\`: \`servePackageRouter\` over \`composeStore(createS3BlobStore, createPostgresRecords)\`) on one PostgreSQL schema and one bucket on ${s3.label}. Each of ${rounds} rounds (100 at scale 1) prepares ${PUBLISHES_PER_ROUND} publishes with each request sent to the next replica (open, 3 files), fires their commits at one replica (alternating), sends it SIGKILL after a random 0–${KILL_WINDOW_MS} ms, commits every unanswered transaction again on the surviving replica (a 409 CONFLICT "retry" is retried every 100 ms), and starts the killed replica again. At the end every transaction's summary is read, every version downloaded (the replica's \`Repr-Digest\` against the body it or S3 serves, the body's digest against the committed one) and the change feed walked from 0.`,
      "",
      "| figure | value |",
      "|---|---:|",
      `| rounds (kills) | ${rounds} |`,
      `| kills landing mid-commit (a commit still unanswered) | ${killsMidCommit} |`,
      `| publishes | ${publishes.length} |`,
      `| commits answered 201 before the kill | ${answeredBeforeKill} |`,
      `| commits sent again to the other replica | ${retriedOnOther} |`,
      `| publishes committed at the end (0 lost) | ${committed} (${lost.length} lost) |`,
      `| torn versions | ${torn.length} |`,
      `| transactions not \`committed\` at the end | ${stuck.length} |`,
      `| committed digest ≠ served bytes | ${wrongDigest.length} |`,
      `| change-feed entries (each publish exactly once) | ${feed.length} (${notOnce.length} wrong) |`,
      `| duration | ${((Date.now() - started) / 1000).toFixed(1)} s (load average ${os
        .loadavg()
        .map((l) => l.toFixed(1))
        .join(" / ")}) |`,
      "",
      holds
        ? "Result: **held** (nothing lost, none torn, nothing stuck, every committed digest served, each publish once in the feed)."
        : `Result: **did not hold**:\n\n${problems
            .slice(0, 20)
            .map((p) => `- ${p}`)
            .join("\n")}`,
    ].join("\n");
  } finally {
    for (const r of replicas) await r.kill();
    await db.drop();
    await s3.close();
  }
}
