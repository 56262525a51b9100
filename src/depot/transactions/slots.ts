/**
 * The open-transaction slots of each principal: one record, `slots/<principal hash>`,
 * listing the ids of its open transactions, changed only by compare-and-swap, so the
 * limit is exact across routers and processes wherever the store's compare-and-swap is.
 * Why: docs/decisions/depot-catalog.md, "slots.ts: open-transaction slots per principal".
 */
import { RunnerDepotError } from "../../errors.js";
import type { PackageStore } from "../ports.js";
import { allKeys, guessedRecord, keys, mapLimit, noteRecord, type TransactionRecord } from "../store/records.js";

/** A `slots/<principal hash>` record: the ids of the principal's open transactions. */
interface SlotRecord {
  ids: string[];
}

/** One take or release waiting for the next write of its principal's slot record. */
interface SlotChange {
  kind: "take" | "release";
  id: string;
  resolve(): void;
  reject(error: unknown): void;
}

/** What the slots need of the transaction logic. */
interface SlotPolicy {
  /** The most open transactions per principal. */
  limit(): number;
  /** Whether a listed transaction still holds its slot (open or committing, not expired). */
  holds(trans: TransactionRecord): boolean;
  /** When a transaction that holds a slot expires (for Retry-After). */
  expiresAt(trans: TransactionRecord): Date;
  now(): Date;
}

/**
 * Takes and releases open-transaction slots, batching concurrent changes per principal.
 *
 * @example
 * const slots = new Slots(store, policy);
 * await slots.take("alice", transactionId); // TOO_MANY_TRANSACTIONS when full
 * await slots.release("alice", transactionId);
 */
export class Slots {
  private readonly waiting = new Map<string, SlotChange[]>();
  private readonly writing = new Set<string>();

  constructor(
    private readonly store: PackageStore,
    private readonly policy: SlotPolicy,
  ) {}

  /** Lists `id` in the principal's slots; TOO_MANY_TRANSACTIONS when the live ones fill the limit. */
  take(principal: string, id: string): Promise<void> {
    return this.enqueue(principal, "take", id);
  }

  /** Drops `id` from the principal's slots (a take that could fill them drops dead ids, so a lost release is harmless). */
  release(principal: string, id: string): Promise<void> {
    return this.enqueue(principal, "release", id);
  }

  /**
   * The transactions that hold a slot now (open or committing, not expired), over every
   * principal and every process sharing the store. O(principals + listed ids) record reads:
   * the slot records, then each listed transaction, never the finished ones the store
   * retains. A take keeps at most `limit` ids listed, so the reads are bounded by
   * principals × (1 + limit).
   */
  async countLive(): Promise<number> {
    let live = 0;
    for await (const key of allKeys(this.store, keys.allSlots)) {
      const ids = (await this.store.getRecord<SlotRecord>(key))?.value.ids ?? [];
      const records = await mapLimit(
        ids,
        16,
        async (id) => (await this.store.getRecord<TransactionRecord>(keys.trans(id)))?.value,
      );
      for (const trans of records) if (trans && this.policy.holds(trans)) live++;
    }
    return live;
  }

  private enqueue(principal: string, kind: SlotChange["kind"], id: string): Promise<void> {
    const key = keys.slots(principal);
    return new Promise<void>((resolve, reject) => {
      let queue = this.waiting.get(key);
      if (!queue) this.waiting.set(key, (queue = []));
      queue.push({ kind, id, resolve, reject });
      if (!this.writing.has(key)) void this.drain(key);
    });
  }

  private async drain(key: string): Promise<void> {
    this.writing.add(key);
    try {
      for (;;) {
        const batch = this.waiting.get(key) ?? [];
        this.waiting.delete(key);
        if (batch.length === 0) return;
        try {
          const refused = await this.apply(key, batch);
          batch.forEach((change, i) => (refused[i] ? change.reject(refused[i]) : change.resolve()));
        } catch (error) {
          for (const change of batch) change.reject(error);
        }
      }
    } finally {
      this.writing.delete(key);
    }
  }

  /**
   * One compare-and-swap applying a batch, retried on lost races; returns each change's
   * refusal (null when applied). Reads every listed transaction only when the batch's takes
   * could fill the slots: O(limit) reads per round then, shared by the batch, and none
   * otherwise, so a take costs O(1) reads amortised over the limit's worth of takes.
   */
  private async apply(key: string, batch: SlotChange[]): Promise<Array<RunnerDepotError | null>> {
    // A finished or expired transaction never reopens, so what was seen dead stays dead.
    const dead = new Set<string>();
    const released = new Set(batch.filter((c) => c.kind === "release").map((c) => c.id));
    const takeCount = batch.filter((c) => c.kind === "take").length;
    const takes = takeCount > 0;
    // The first try starts from the record as this process last wrote or read it (in one
    // process every change of a principal's slots passes through this batcher, so it is
    // current unless another process wrote since); a refusal or a lost swap on it is
    // judged again on a fresh read.
    let guess = guessedRecord<SlotRecord>(this.store, key);
    for (let attempt = 0; attempt < 200; attempt++) {
      const fromGuess = guess !== undefined;
      const current = guess ?? (await this.store.getRecord<SlotRecord>(key));
      guess = undefined;
      if (!fromGuess) noteRecord(this.store, key, current);
      const listed = (current?.value.ids ?? []).filter((i) => !dead.has(i) && !released.has(i));
      const live: TransactionRecord[] = [];
      // Listed ids are only read (and the dead ones dropped) when they could fill the slots: while
      // listed + taken stays within the limit the live ones certainly do, and a take costs no read.
      const judge = takes && listed.length + takeCount > this.policy.limit();
      if (judge) {
        const records = await mapLimit(
          listed,
          16,
          async (i) => (await this.store.getRecord<TransactionRecord>(keys.trans(i)))?.value,
        );
        records.forEach((trans, i) => {
          if (trans && this.policy.holds(trans)) live.push(trans);
          else dead.add(listed[i]!);
        });
      }
      const ids = judge ? live.map((t) => t.id) : listed;
      const refused = batch.map((change) => {
        if (change.kind === "release") return null;
        if (ids.length >= this.policy.limit()) return this.full(live);
        ids.push(change.id);
        return null;
      });
      const unchanged =
        current !== null &&
        ids.length === current.value.ids.length &&
        ids.every((id, i) => id === current.value.ids[i]);
      if (fromGuess && (unchanged || refused.some((r) => r !== null))) continue;
      if (unchanged || (current === null && ids.length === 0)) return refused;
      // Only releases: lazy, since a slot a machine crash keeps is dropped by the next take.
      const written = await this.store.putRecord(key, { ids } satisfies SlotRecord, {
        ifRevision: current?.revision ?? null,
        lazy: !takes,
      });
      if (written !== null) {
        noteRecord(this.store, key, { value: { ids }, revision: written });
        return refused;
      }
      if (!fromGuess) await new Promise((resolve) => setTimeout(resolve, Math.random() * Math.min(2 ** attempt, 50)));
    }
    throw new RunnerDepotError("CONFLICT", "Too much contention on the open-transaction slots; retry");
  }

  private full(live: TransactionRecord[]): RunnerDepotError {
    const limit = this.policy.limit();
    // No live one listed: this batch's own takes filled the slots (retry after a second).
    const soonest = live.length > 0 ? Math.min(...live.map((t) => this.policy.expiresAt(t).getTime())) : 0;
    const retryAfter = Math.max(1, Math.ceil((soonest - this.policy.now().getTime()) / 1000));
    return new RunnerDepotError(
      "TOO_MANY_TRANSACTIONS",
      `At most ${limit} open transactions per principal; commit or abandon one`,
      {
        details: { retryAfter },
      },
    );
  }
}
