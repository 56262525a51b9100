/**
 * The idle limit of every StreamLogs call of a service on one timer: a sweep every
 * {@link idleTickMs} over the calls in progress ends those that have waited for their next
 * item for `idleMs` or more. A timer per call (re-armed as items came) cost every open
 * stream a Timeout, its closure and a timer list entry; 1,000 open streams are a 1,000-entry
 * loop once a second instead. A call is ended between `idleMs` and `idleMs` + one tick
 * after its wait began. While the server itself holds calls back (the store backlog over
 * its budget, store-backlog.ts: readers paused), a call's wait is not the agent's silence:
 * waits count from the last sweep that saw the server holding calls back, if later. Only
 * for calls that passed authentication: the backlog never holds any other (their first
 * message is read regardless), so a caller with a made-up token that sends nothing keeps
 * its idle limit however long the store lags.
 */
import { RunnerDepotError } from "../errors.js";

/** What the sweep needs of a call (CallRun implements it). */
export interface IdleCall {
  /** When the call started waiting for its next item (Date.now()); 0 while it is not waiting. */
  readonly waitingSince: number;
  /** The job the call writes to, once it passed authentication; "" before. */
  readonly id: string;
  /** Ends the call with `error` (a no-op for a call already stopped). */
  stop(error: RunnerDepotError): void;
}

/** The sweep's period for an idle limit: a quarter of it, between 10 ms and 1 s. */
export function idleTickMs(idleMs: number): number {
  return Math.min(1000, Math.max(10, Math.floor(idleMs / 4)));
}

/**
 * The idle sweep of one service, over its set of calls in progress.
 *
 * @example
 * const calls = new Set<IdleCall>();
 * const idle = new IdleSweep(calls, 60_000);
 * calls.add(call);
 * idle.watch(); // after each add: starts the timer if it is not running
 */
export class IdleSweep {
  private timer: NodeJS.Timeout | null = null;
  /** The last sweep (Date.now()) that saw the server holding calls back; 0 never. */
  private heldAt = 0;

  constructor(
    private readonly calls: ReadonlySet<IdleCall>,
    private readonly idleMs: number,
    /** True while the server holds calls back (not reading them); default never. */
    private readonly heldBack: () => boolean = () => false,
  ) {}

  /** Makes sure the sweep runs (it stops itself once no call is left). O(1). */
  watch(): void {
    if (this.timer !== null) return;
    this.timer = setInterval(() => this.sweep(), idleTickMs(this.idleMs));
    // Open calls keep their server's sockets, and so the process, alive: the sweep need not.
    this.timer.unref();
  }

  /** Stops the timer (the service is closing, or no call is left). */
  stop(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  /** O(calls in progress). */
  private sweep(): void {
    if (this.calls.size === 0) return this.stop();
    const now = Date.now();
    if (this.heldBack()) this.heldAt = now;
    for (const call of this.calls) {
      if (call.waitingSince !== 0 && now - (call.id === "" ? call.waitingSince : Math.max(call.waitingSince, this.heldAt)) >= this.idleMs) {
        call.stop(new RunnerDepotError("DEADLINE_EXCEEDED", `no item for ${this.idleMs} ms; the call was ended`));
      }
    }
  }
}
