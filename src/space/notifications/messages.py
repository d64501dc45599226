"""What a notification says: its title (the in-app line and the email's subject) and the email itself, built with
the standard library's `email` package (plain text and an HTML alternative, RFC 5322 headers).

An email tells what happened in plain words and links to the thing's place in the page; it never holds a download
URL, a link token, a bearer token, an export's filters (a `q` may be anything the user typed) or any exported
content: everything it says comes from the notification's own `details` (kind, rows, bytes, expiry, error code)
and the names of the org and the recipient. Of an import that failed, it says the error code in words and never
the import's `errorDetail`, which may quote the archive (an email, a value of a line).
"""

from __future__ import annotations

import datetime as dt
import html
import uuid
from dataclasses import dataclass
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime
from typing import Any

from space.notifications import words
from space.notifications.models import NotificationType

PREFERENCES_PATH = "/#/me/preferences"
"""The page's place for a user's notification settings: every email's List-Unsubscribe."""

IMPORT_FAILED_SHORT = {
    "archive_invalid": "the file is not a valid archive",
    "ids_in_use": "its ids are in use here",
    "org_limit_reached": "you have as many organizations as one person may",
    "too_large": "the file is too large",
    "restore_failed": "an unexpected error stopped it",
}
"""Why a restore failed, in a few words for its title (`words.IMPORT_REASONS` says it in full)."""


# --- titles, written with the row ---------------------------------------------------------------------------


def export_title(type_: NotificationType, kind: str, org_name: str) -> str:
    """ "Your Tickets (CSV) export in Acme is ready" (failed, was cancelled)."""
    what = {
        NotificationType.export_completed: "is ready",
        NotificationType.export_failed: "failed",
        NotificationType.export_cancelled: "was cancelled",
    }[type_]
    return f"Your {words.kind(kind)} export in {org_name} {what}"


def deletion_title(org_name: str) -> str:
    """ "Acme is going to be deleted"."""
    return f"{org_name} is going to be deleted"


def schedule_paused_title(kind: str, org_name: str, reason: str) -> str:
    """ "A schedule of Tickets (CSV) exports in Acme was paused: its runs kept failing"."""
    why = {
        "access_revoked": "its creator is no longer an owner or admin",
        "destination_failed": "its destination refused a delivery",
    }.get(reason, "its runs kept failing")
    return f"A schedule of {words.kind(kind)} exports in {org_name} was paused: {why}"


def import_failed_title(name: str, error_code: str) -> str:
    """ "Your archive could not be restored as Acme: the file is not a valid archive"."""
    why = IMPORT_FAILED_SHORT.get(error_code, f"it stopped ({error_code})")
    return f"Your archive could not be restored as {name}: {why}"


# --- the email, built when it is sent -----------------------------------------------------------------------


@dataclass(frozen=True)
class Letter:
    """Everything one email is made of, read at send time."""

    notification_id: uuid.UUID
    type: NotificationType
    org_id: uuid.UUID | None
    """None for a user's own notification of an event that has no org (`import.failed`)."""
    org_name: str
    export_id: uuid.UUID | None
    title: str
    details: dict[str, Any]
    at: dt.datetime
    recipient_name: str
    recipient_email: str
    import_id: uuid.UUID | None = None


def place(public_base: str, letter: Letter) -> str:
    """Where in the page the email leads: the export (`#/orgs/<orgId>/exports/<exportId>`), an import of no org
    (`#/imports/<importId>`, beside the page's restore), else the org."""
    if letter.org_id is None:
        if letter.import_id is not None:
            return f"{public_base}/#/imports/{letter.import_id}"
        return f"{public_base}/"
    if letter.export_id is not None:
        return f"{public_base}/#/orgs/{letter.org_id}/exports/{letter.export_id}"
    if letter.type is NotificationType.schedule_paused:
        return f"{public_base}/#/orgs/{letter.org_id}/settings"
    return f"{public_base}/#/orgs/{letter.org_id}"


def paragraphs(letter: Letter) -> list[str]:
    """What happened, one paragraph each, in the page's words."""
    d = letter.details
    org = letter.org_name
    match letter.type:
        case NotificationType.export_completed:
            out = [f"Your {words.kind(d.get('kind'))} export in {org} is ready: {_facts(d)}."]
            expires = d.get("expiresAt")
            if expires:
                out.append(f"You can download it until {words.when(dt.datetime.fromisoformat(expires))}.")
            return out
        case NotificationType.export_failed:
            return [f"Your {words.kind(d.get('kind'))} export in {org} failed.", words.reason(d.get("errorCode"))]
        case NotificationType.export_cancelled:
            return [
                f"Your {words.kind(d.get('kind'))} export in {org} was cancelled.",
                words.reason(d.get("errorCode")),
            ]
        case NotificationType.schedule_paused:
            out = [f"{letter.title}."]
            if d.get("reason") == "failing":
                out.append(
                    f"Its last {d.get('failures')} runs failed; the last one: {words.reason(d.get('errorCode'))}"
                )
            out.append("An owner or admin can resume it in the organization's schedules.")
            return out
        case NotificationType.org_deletion_requested:
            who = d.get("actorName") or "An owner"
            out = [f"{who} asked to delete the organization {org}."]
            after = d.get("deleteAfter")
            if after:
                out.append(
                    f"Unless an owner cancels the deletion, {org} and all its data will be deleted after"
                    f" {words.when(dt.datetime.fromisoformat(after))}. Take a complete archive before then if"
                    " you need its data."
                )
            return out
        case NotificationType.import_failed:
            out = [f"{letter.title}.", words.import_reason(d.get("errorCode"))]
            if d.get("errorCode") == "archive_invalid":
                out.append("The import in Space says which member of the file, and which line, is wrong.")
            return out
    return [letter.title]


def _facts(d: dict[str, Any]) -> str:
    parts = []
    if d.get("rows") is not None:
        parts.append(words.count(int(d["rows"])))
    if d.get("bytes") is not None:
        parts.append(words.size(int(d["bytes"])))
    return ", ".join(parts) or "finished"


def compose(letter: Letter, *, public_base: str, mail_from: tuple[str, str]) -> EmailMessage:
    """The email of `letter`: headers, a plain-text part and its HTML alternative."""
    link = place(public_base, letter)
    preferences = public_base + PREFERENCES_PATH
    said = [p for p in paragraphs(letter) if p]
    why = (
        "You get this email because of your place in this organization on Space."
        if letter.org_id is not None
        else "You get this email because of what you did on Space."
    )
    sender_name, sender_address = mail_from
    message = EmailMessage()
    message["Subject"] = one_line(letter.title)
    # Address objects, not formatted strings: the policy quotes or encodes a name with commas, colons or quotes so
    # that it stays a name (a name is whatever its person typed).
    message["From"] = Address(display_name=one_line(sender_name), addr_spec=sender_address)
    message["To"] = Address(display_name=one_line(letter.recipient_name), addr_spec=letter.recipient_email)
    message["Date"] = format_datetime(letter.at.astimezone(dt.UTC))
    # The notification's own id: every attempt of one notification is the same message to a receiver.
    message["Message-ID"] = f"<{letter.notification_id}@{sender_address.rpartition('@')[2]}>"
    message["Auto-Submitted"] = "auto-generated"
    # Out-of-office and other automatic replies to a notification help no one.
    message["X-Auto-Response-Suppress"] = "All"
    message["List-Unsubscribe"] = f"<{preferences}>"
    text = [f"Hello {letter.recipient_name},", "", *_blank_lines(said), "", f"Open it in Space: {link}", ""]
    text += ["--", why, f"Choose which emails Space sends you: {preferences}", ""]
    message.set_content("\n".join(text))
    e = html.escape
    body = "".join(f"<p>{e(p)}</p>" for p in said)
    message.add_alternative(
        "<!doctype html><html><body>"
        f"<p>Hello {e(letter.recipient_name)},</p>{body}"
        f'<p><a href="{e(link)}">Open it in Space</a></p>'
        f'<hr><p><small>{e(why)} <a href="{e(preferences)}">Choose which emails Space sends you</a>.</small></p>'
        "</body></html>",
        subtype="html",
    )
    return message


def one_line(value: str) -> str:
    """`value` fit for a header: names may hold line breaks and other controls, a header may not."""
    return " ".join("".join(c if c.isprintable() else " " for c in value).split())


def _blank_lines(said: list[str]) -> list[str]:
    out: list[str] = []
    for p in said:
        if out:
            out.append("")
        out.append(p)
    return out
