package gnomon.connect;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.avro.Schema;
import org.apache.kafka.connect.errors.DataException;
import org.apache.kafka.connect.errors.RetriableException;

/**
 * Writer schemas by id from a Confluent-REST-compatible registry: {@code GET
 * <url>/schemas/ids/{id}} answers {@code {"schema": "<Avro JSON>", "references": [...]}}; each
 * reference ({@code name, subject, version}) is fetched from {@code
 * /subjects/{subject}/versions/{version}} and parsed first, so named types it defines resolve.
 * Ids are immutable in a registry, so a schema is fetched once and cached for the life of the
 * converter; failures are not cached (the next record asks again). An unreachable registry
 * or a 5xx answer is a {@link RetriableException} (Connect retries it for {@code
 * errors.retry.timeout}); any other answer, e.g. 404 for an unknown id, a DataException.
 */
final class RegistryClient {
    private static final ObjectMapper JSON = new ObjectMapper();
    private final String baseUrl;
    private final Duration timeout;
    private final HttpClient http;
    private final Map<Integer, Schema> byId = new ConcurrentHashMap<>();

    private final String authorization;

    RegistryClient(String baseUrl, Duration timeout, String userInfo) {
        this.baseUrl = baseUrl.replaceAll("/+$", "");
        this.timeout = timeout;
        this.authorization = userInfo == null || userInfo.isEmpty() ? null
                : "Basic " + java.util.Base64.getEncoder().encodeToString(userInfo.getBytes(StandardCharsets.UTF_8));
        this.http = HttpClient.newBuilder().connectTimeout(timeout).build();
    }

    String url() {
        return baseUrl;
    }

    Schema schema(int id) {
        Schema cached = byId.get(id);
        if (cached != null) {
            return cached;
        }
        JsonNode doc = get("/schemas/ids/" + id, "schema id " + id);
        Schema.Parser parser = new Schema.Parser();
        parseReferences(parser, doc, new HashSet<>());
        Schema schema = parser.parse(text(doc, "schema", "schema id " + id));
        byId.put(id, schema);
        return schema;
    }

    private void parseReferences(Schema.Parser parser, JsonNode doc, Set<String> seen) {
        JsonNode refs = doc.get("references");
        if (refs == null || !refs.isArray()) {
            return;
        }
        for (JsonNode ref : refs) {
            String subject = text(ref, "subject", "a reference");
            String version = ref.path("version").asText("latest");
            if (!seen.add(subject + "/" + version)) {
                continue;
            }
            String what = "reference " + subject + " v" + version;
            JsonNode referenced = get("/subjects/" + URLEncoder.encode(subject, StandardCharsets.UTF_8)
                    + "/versions/" + version, what);
            parseReferences(parser, referenced, seen);
            parser.parse(text(referenced, "schema", what));
        }
    }

    private JsonNode get(String path, String what) {
        HttpRequest.Builder builder = HttpRequest.newBuilder(URI.create(baseUrl + path)).timeout(timeout)
                .header("Accept", "application/vnd.schemaregistry.v1+json, application/json");
        if (authorization != null) {
            builder.header("Authorization", authorization);
        }
        HttpRequest request = builder.GET().build();
        HttpResponse<String> response;
        try {
            response = http.send(request, HttpResponse.BodyHandlers.ofString());
        } catch (IOException e) {
            throw new RetriableException("schema registry " + baseUrl + " unreachable for " + what + ": " + e, e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new DataException("interrupted fetching " + what + " from " + baseUrl, e);
        }
        if (response.statusCode() != 200) {
            String body = response.body();
            String message = "schema registry " + baseUrl + path + " answered " + response.statusCode()
                    + " for " + what + ": " + (body.length() > 300 ? body.substring(0, 300) : body);
            if (response.statusCode() >= 500) {
                throw new RetriableException(message);
            }
            throw new DataException(message);
        }
        try {
            return JSON.readTree(response.body());
        } catch (IOException e) {
            throw new DataException("schema registry " + baseUrl + path + ": not JSON", e);
        }
    }

    private static String text(JsonNode doc, String field, String what) {
        JsonNode node = doc.get(field);
        if (node == null || !node.isTextual()) {
            throw new DataException("schema registry answer for " + what + " has no \"" + field + "\" string");
        }
        return node.asText();
    }
}
