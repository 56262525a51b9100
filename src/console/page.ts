/** The HTML shell of every console page: landmarks, navigation, and the app's script and style. */

/** Which page the shell is for, and its subject. */
export interface PageSpec {
  page: "home" | "jobs" | "packages" | "job" | "package" | "login" | "not-found";
  /** Job ID or package name. */
  subject?: string;
  title: string;
  csrf: string;
  base: string;
  /** Query string suffixes of the asset URLs (content hashes, so they cache forever). */
  assetVersion: string;
  /** Shown instead of the app (login page). */
  message?: string;
  /** A one-time login token to spend with a POST to `<base>/login` when the person presses "Sign in". */
  loginToken?: string;
  /** Where the login goes after signing in (the page the login URL named). */
  loginNext?: string;
}

/** Escapes text for HTML content and attribute values. */
function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** Renders the shell. The app (console.js) fills `<main>` from the JSON API. */
export function renderPage(spec: PageSpec): string {
  const base = escapeHtml(spec.base);
  const v = escapeHtml(spec.assetVersion);
  // The token is spent by the button's POST only: a link preview's GET leaves it usable.
  const form =
    spec.loginToken === undefined
      ? ""
      : `<form method="post" action="${base}/login"><input type="hidden" name="token" value="${escapeHtml(spec.loginToken)}"><input type="hidden" name="next" value="${escapeHtml(spec.loginNext ?? "")}"><button type="submit">Sign in</button></form>`;
  const body = spec.message
    ? `<h1>runner-depot console</h1><p>${escapeHtml(spec.message)}</p>${form}`
    : `<p class="loading" role="status">Loading…</p><noscript>The console needs JavaScript.</noscript>`;
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escapeHtml(spec.title)} · runner-depot</title>
<meta name="csrf-token" content="${escapeHtml(spec.csrf)}">
<meta name="console-base" content="${base}">
<link rel="stylesheet" href="${base}/assets/console.css?v=${v}">
${spec.message ? "" : `<script type="module" src="${base}/assets/console.js?v=${v}"></script>`}
</head>
<body>
<a class="skip" href="#main">Skip to content</a>
<header class="top">
<nav aria-label="Console">
<a class="brand" href="${base}/">runner-depot</a>
<a href="${base}/jobs">Jobs</a>
<a href="${base}/packages">Packages</a>
</nav>
</header>
<main id="main" tabindex="-1" data-page="${spec.page}" data-subject="${escapeHtml(spec.subject ?? "")}">
${body}
</main>
</body>
</html>
`;
}
