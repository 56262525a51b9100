/**
 * serve's garbage-collection schedule (src/cli/serve-gc.ts): runs never overlap, whatever
 * the interval and however long a run takes; a failed run does not stop the schedule;
 * stop() waits for a run in progress and no run starts after it.
 */
import { describe, expect, it } from "vitest";
import { scheduleGarbageCollection } from "../../../src/cli/serve/serve-gc.js";

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe("scheduleGarbageCollection", () => {
  it("never runs two collections at once, goes on after a failure, and stop() waits for the run in progress", async () => {
    let running = 0;
    let most = 0;
    let runs = 0;
    let finished = 0;
    const schedule = scheduleGarbageCollection(async () => {
      runs++;
      running++;
      most = Math.max(most, running);
      // Each run lasts far longer than the 1 ms interval.
      await pause(30);
      running--;
      finished++;
      if (runs === 2) throw new Error("store down");
    }, 1);
    while (runs < 4) await pause(5);
    await schedule.stop();
    expect(most).toBe(1);
    // The run in progress at stop() had finished when stop() resolved; none started after.
    expect(running).toBe(0);
    const after = runs;
    expect(finished).toBe(after);
    await pause(50);
    expect(runs).toBe(after);
  });
});
