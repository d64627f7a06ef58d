// Opens a page in Debian's headless Chromium (playwright-core drives it; no browser download),
// prints what the e2e test asserts on as one JSON line, saves a full-page screenshot, then, with
// a fourth argument, waits for that selector to appear on its own (the page refreshes itself),
// prints a second JSON line and saves the screenshot again.
//
//   node screenshot.mjs URL SELECTOR OUT.png [LATER_SELECTOR]
import { chromium } from 'playwright-core';

const [url, selector, out, later] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  // As root, in a sandbox with no network but loopback: no background services.
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});

/** What the page shows, as the test checks it. */
function facts() {
  const all = (sel, f) => [...document.querySelectorAll(sel)].map(f);
  const dev = document.querySelector('.dev.free');
  const box = dev ? dev.getBoundingClientRect() : { width: 0, height: 0 };
  return {
    title: document.title,
    totals: document.querySelector('#totals')?.innerText ?? '',
    superNodes: all('h2.super-node', (e) => e.dataset.id),
    nodes: all('tr.node', (e) => ({
      node: e.dataset.node,
      free: e.querySelectorAll('.dev.free').length,
      used: e.querySelectorAll('.dev.used').length,
      unhealthy: e.querySelectorAll('.dev.unhealthy').length,
    })),
    pending: all('tr.pending', (e) => ({ pod: e.dataset.pod, text: e.innerText })),
    decisions: all('h3.decision', (e) => e.dataset.pod),
    deviceBox: [box.width, box.height],
    freeColor: dev ? getComputedStyle(dev).backgroundColor : '',
  };
}

try {
  const page = await browser.newPage({ viewport: { width: 1200, height: 800 } });
  await page.goto(url);
  await page.waitForSelector(selector, { timeout: 15000 });
  console.log(JSON.stringify(await page.evaluate(facts)));
  await page.screenshot({ path: out, fullPage: true });
  if (later) {
    await page.waitForSelector(later, { timeout: 30000 });
    console.log(JSON.stringify(await page.evaluate(facts)));
    await page.screenshot({ path: out, fullPage: true });
  }
} finally {
  await browser.close();
}
