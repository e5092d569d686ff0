"""Messages still flash across a redirect with the storage built lazily (core.middleware.LazyMessageMiddleware), and a
request that never touches messages sets no message cookie."""

import pytest
from django.contrib import messages
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.http import HttpResponse
from django.utils.functional import empty

from core.middleware import LazyMessageMiddleware

COOKIE = "messages"  # CookieStorage.cookie_name


def _stack(view):
    return SessionMiddleware(LazyMessageMiddleware(view))


@pytest.mark.django_db
def test_a_message_added_on_one_request_is_read_on_the_next(rf, settings):
    settings.MESSAGE_STORAGE = "django.contrib.messages.storage.cookie.CookieStorage"

    def add(request):
        messages.success(request, "Pool batch saved.")
        return HttpResponse()

    def read(request):
        return HttpResponse("|".join(str(m) for m in messages.get_messages(request)))

    first = _stack(add)(rf.get("/"))
    cookie = first.cookies[COOKIE].value
    assert cookie
    second = rf.get("/")
    second.COOKIES[COOKIE] = cookie
    assert _stack(read)(second).content == b"Pool batch saved."


@pytest.mark.django_db
def test_a_request_that_never_touches_messages_leaves_them_where_they_are(rf, settings):
    """Django's own middleware would not delete a cookie here either: an unread storage saves nothing."""
    settings.MESSAGE_STORAGE = "django.contrib.messages.storage.cookie.CookieStorage"
    request = rf.get("/")
    request.COOKIES[COOKIE] = "queued"
    for middleware in (MessageMiddleware, LazyMessageMiddleware):
        response = SessionMiddleware(middleware(lambda request: HttpResponse()))(request)
        assert COOKIE not in response.cookies
    assert request._messages._wrapped is empty  # LazyMessageMiddleware's storage was never built
