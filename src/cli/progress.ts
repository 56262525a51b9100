/**
 * Progress for `publish` and `install`: a cli-progress bar on a TTY (bytes, items,
 * rate, ETA), plain lines when stderr is not a terminal (CI logs, pipes).
 */
import cliProgress from "cli-progress";

/** A progress sink for one phase of work. */
export interface Progress {
  /** Sets totals and the current value; `label` names what is moving. */
  update(value: number, total: number, payload: { label: string; bytes: number }): void;
  stop(message?: string): void;
}

/** Human-readable byte count. */
export function formatBytes(bytes: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}

/** Creates a bar on a TTY, or a line printer that speaks at most every `intervalMs`. */
export function createProgress(title: string, unit: "items" | "bytes", stream: NodeJS.WriteStream = process.stderr, intervalMs = 1000): Progress {
  const started = Date.now();
  const rate = (bytes: number) => `${formatBytes(bytes / Math.max((Date.now() - started) / 1000, 0.001))}/s`;
  if (stream.isTTY) {
    const bar = new cliProgress.SingleBar(
      {
        stream,
        format: `${title} {bar} {percentage}% | {value}/{total} ${unit === "bytes" ? "bytes" : "items"} | {size} | {rate} | ETA {eta_formatted} | {label}`,
        hideCursor: true,
        etaBuffer: 50,
      },
      cliProgress.Presets.shades_classic,
    );
    let startedBar = false;
    return {
      update(value, total, payload) {
        const extra = { label: payload.label, size: formatBytes(payload.bytes), rate: rate(payload.bytes) };
        if (!startedBar) {
          bar.start(total, value, extra);
          startedBar = true;
        } else {
          bar.setTotal(total);
          bar.update(value, extra);
        }
      },
      stop(message) {
        if (startedBar) bar.stop();
        if (message) stream.write(`${message}\n`);
      },
    };
  }
  let last = 0;
  return {
    update(value, total, payload) {
      const now = Date.now();
      if (now - last < intervalMs && value < total) return;
      last = now;
      stream.write(`${title}: ${value}/${total} ${unit} ${formatBytes(payload.bytes)} ${rate(payload.bytes)} ${payload.label}\n`);
    },
    stop(message) {
      if (message) stream.write(`${message}\n`);
    },
  };
}
