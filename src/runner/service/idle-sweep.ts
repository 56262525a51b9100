/**
 * The idle limit of every StreamLogs call of a service on one timer: a sweep every {@link idleTickMs} over
 * the calls in progress ends those that have waited for their next item for `idleMs` or more. A timer per
 * call (re-armed as items came) cost every open stream a Timeout, its closure and a timer list entry; 1,000
 * open streams are a 1,000-entry loop once a second instead. A call is ended between `idleMs` and `idleMs` +
 * one tick after its wait began.
 * Why: docs/decisions/runner-server.md, "idle-sweep.ts: one timer for every call's idle limit".
 */
import { RunnerDepotError } from "../../errors.js";

/** What the sweep needs of a call (CallRun implements it). */
export interface IdleCall {
  /** When the call started waiting for its next item (Date.now()); 0 while it is not waiting. */
  readonly waitingSince: number;
  /** True while the server holds the call back (not reading it); its wait does not count then. */
  readonly heldBack: boolean;
  /** The last sweep (Date.now()) that saw the call held back; 0 never. The sweep writes it. */
  heldAt: number;
  /** Ends the call with `error` (a no-op for a call already stopped). */
  stop(error: RunnerDepotError): void;
}

/** The sweep's period for an idle limit: a quarter of it, between 10 ms and 1 s. */
function idleTickMs(idleMs: number): number {
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

  constructor(
    private readonly calls: ReadonlySet<IdleCall>,
    private readonly idleMs: number,
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
    for (const call of this.calls) {
      if (call.waitingSince === 0) continue;
      if (call.heldBack) {
        call.heldAt = now;
        continue;
      }
      if (now - Math.max(call.waitingSince, call.heldAt) >= this.idleMs) {
        call.stop(new RunnerDepotError("DEADLINE_EXCEEDED", `no item for ${this.idleMs} ms; the call was ended`));
      }
    }
  }
}
