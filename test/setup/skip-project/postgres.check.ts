// Run only by test/setup/global-setup.test.ts (see vitest.config.ts beside it).
import pg from "pg";
import { expect, it } from "vitest";
import { needs, POSTGRES_URL, SERVICES } from "../../fixtures/backends.js";

needs("postgres");

it("gets the decided PostgreSQL, which answers", async () => {
  const client = new pg.Client({ connectionString: POSTGRES_URL });
  await client.connect();
  try {
    expect((await client.query("select 41 + 1 as n")).rows).toEqual([{ n: 42 }]);
  } finally {
    await client.end();
  }
  console.log(`CHECK postgres=${SERVICES.postgres.how} url=${POSTGRES_URL}`);
});
