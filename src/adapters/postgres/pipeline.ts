/**
 * Statements of many concurrent callers over a few long-lived connections in pipeline mode
 * (node-postgres's `pipeline: true`): a connection carries many statements at once, each still
 * its own implicit transaction (its own Sync: an error or a rollback ends with it, and a
 * `set_config(…, true)` with it), answered in the order sent. The statements sent to one
 * connection in one tick leave in one write, and the server reads them in one go: a publish's
 * round trips cost a fraction of the CPU they cost one by one through a pool, on both sides.
 * Why and the figures: docs/decisions/depot-scale-out.md, "Pipelined statements".
 */
import pg from "pg";
import type { ClientConfig, QueryConfig } from "pg";

/** A few pipelined connections, opened on first use and again after one breaks. */
export interface Pipeline {
  /** Sends one statement on the connection with the fewest unanswered; its rows. */
  query<R>(config: QueryConfig): Promise<R[]>;
  /** Ends every connection (statements already sent are answered first). */
  close(): Promise<void>;
}

interface Lane {
  client: pg.Client;
  /** Settles when the connection is up; null once it is. */
  connecting: Promise<void> | null;
  /** Statements sent and not yet answered. */
  inFlight: number;
  /** A write to the socket is held until the end of this tick (cork), so one tick's statements go out together. */
  corked: boolean;
}

/**
 * Creates a pipeline of `connections` connections made from `config()`.
 *
 * @example
 * const pipeline = createPipeline(() => pool.options, 2);
 * const rows = await pipeline.query({ name: "get", text: "SELECT value FROM t WHERE key = $1", values: [key] });
 */
export function createPipeline(config: () => ClientConfig, connections: number): Pipeline {
  const lanes: Array<Lane | null> = Array.from({ length: connections }, () => null);
  let closed = false;

  function open(slot: number): Lane {
    const client = new pg.Client({ ...config(), pipeline: true });
    const lane: Lane = { client, connecting: null, inFlight: 0, corked: false };
    // A broken connection fails what it carries (node-postgres rejects each) and is replaced on next use.
    const drop = () => {
      if (lanes[slot] === lane) lanes[slot] = null;
    };
    client.on("error", () => {
      drop();
      client.end().catch(() => undefined);
    });
    client.on("end", drop);
    lane.connecting = client.connect().then(
      () => {
        lane.connecting = null;
      },
      (error: unknown) => {
        drop();
        throw error;
      },
    );
    lanes[slot] = lane;
    return lane;
  }

  /** The open lane with the fewest unanswered statements, or a missing one opened. O(connections). */
  function pick(): Lane {
    let best: Lane | null = null;
    for (let slot = 0; slot < lanes.length; slot++) {
      const lane = lanes[slot] ?? open(slot);
      if (!best || lane.inFlight < best.inFlight) best = lane;
      if (lane.inFlight === 0) break;
    }
    return best!;
  }

  function send<R>(lane: Lane, config: QueryConfig): Promise<R[]> {
    const stream = lane.client.connection.stream;
    if (!lane.corked && typeof stream.cork === "function") {
      lane.corked = true;
      stream.cork();
      process.nextTick(() => {
        lane.corked = false;
        stream.uncork();
      });
    }
    lane.inFlight++;
    return lane.client.query(config).then(
      (result) => {
        lane.inFlight--;
        return result.rows as R[];
      },
      (error: unknown) => {
        lane.inFlight--;
        throw error;
      },
    );
  }

  return {
    async query<R>(config: QueryConfig): Promise<R[]> {
      if (closed) throw new Error("pipeline closed");
      const lane = pick();
      if (lane.connecting) {
        lane.inFlight++; // counted while it waits, so callers spread over the lanes
        try {
          await lane.connecting;
        } finally {
          lane.inFlight--;
        }
      }
      return send<R>(lane, config);
    },

    async close() {
      closed = true;
      const open = lanes.filter((lane): lane is Lane => lane !== null);
      lanes.fill(null);
      await Promise.all(open.map((lane) => lane.client.end().catch(() => undefined)));
    },
  };
}
