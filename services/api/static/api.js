// Requests to the Unicron API: every one a GET carrying the token the user typed, kept in this
// tab's sessionStorage, so the page sees exactly what that token may see; a 401 asks for one.
import { $ } from "./dom.js";

export const TOKEN_KEY = "unicron.token";
let tokenWanted = null; // the promise of the token dialog while it is open

export class Unauthorized extends Error {
  constructor(message, token) {
    super(message);
    this.token = token;
  }
}

function authHeaders(extra) {
  const headers = Object.assign({}, extra);
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  return headers;
}

export async function reason(response) {
  try {
    const body = await response.json();
    if (typeof body.detail === "string") return body.detail;
    return body.message || response.statusText;
  } catch {
    return response.status + " " + response.statusText;
  }
}

export async function get(path, extra) {
  const sent = sessionStorage.getItem(TOKEN_KEY);
  const response = await fetch(path, { headers: authHeaders(extra), cache: "no-store" });
  if (response.status === 401) throw new Unauthorized(await reason(response), sent);
  return response;
}

export async function getJson(path, missing) {
  const response = await get(path);
  if (response.status === 404 && missing !== undefined) return missing;
  if (!response.ok) throw new Error(path + ": " + (await reason(response)));
  return response.json();
}

// Ask for a token, once however many requests were refused. A refusal of a token the user
// has since replaced asks nothing: the caller just tries again with the new one.
export function needToken(refused) {
  if (tokenWanted) return tokenWanted;
  if (refused.token !== sessionStorage.getItem(TOKEN_KEY)) return Promise.resolve();
  sessionStorage.removeItem(TOKEN_KEY);
  $("login-why").textContent = refused.message;
  const dialog = $("login");
  tokenWanted = new Promise((resolve) => {
    $("login-form").onsubmit = (submitted) => {
      submitted.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
      $("token").value = "";
      dialog.close();
      tokenWanted = null;
      showForget();
      resolve();
    };
  });
  dialog.showModal();
  return tokenWanted;
}

export function showForget() {
  $("forget").hidden = !sessionStorage.getItem(TOKEN_KEY);
}
