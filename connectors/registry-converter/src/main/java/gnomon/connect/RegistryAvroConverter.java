package gnomon.connect;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.Map;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.kafka.common.config.AbstractConfig;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaAndValue;
import org.apache.kafka.connect.errors.DataException;
import org.apache.kafka.connect.storage.Converter;

/**
 * Reads Confluent-framed Avro (byte 0: magic 0; bytes 1-4: the schema id, big-endian; then
 * the Avro binary) by fetching the writer schema from a Confluent-REST-compatible schema
 * registry ({@code registry.url}, {@code GET /schemas/ids/{id}}, cached per id).
 *
 * <p>{@code output=struct} (the default) gives a Connect Struct and its schema, for sinks
 * that map fields (JDBC, S3 with a structured format). {@code output=json} gives the record
 * as one line of JSON text (a STRING value), for sinks that write {@code value.toString()}
 * such as FileStreamSink: a JSON-lines file. A tombstone (null) stays null.
 *
 * <p>Read-only: {@link #fromConnectData} is refused (gnomon's producers write the topics).
 */
public class RegistryAvroConverter implements Converter {
    public static final String REGISTRY_URL = "registry.url";
    public static final String OUTPUT = "output";
    public static final String TIMEOUT_MS = "registry.timeout.ms";
    public static final String USER_INFO = "basic.auth.user.info";
    private static final byte MAGIC = 0;

    static final ConfigDef CONFIG = new ConfigDef()
            .define(REGISTRY_URL, ConfigDef.Type.STRING, ConfigDef.NO_DEFAULT_VALUE, ConfigDef.Importance.HIGH,
                    "Base URL of the Confluent-REST-compatible schema registry, e.g. http://127.0.0.1:8081")
            .define(OUTPUT, ConfigDef.Type.STRING, "struct", ConfigDef.ValidString.in("struct", "json"),
                    ConfigDef.Importance.MEDIUM, "struct: a Connect Struct; json: one line of JSON text")
            .define(TIMEOUT_MS, ConfigDef.Type.LONG, 10_000L, ConfigDef.Range.atLeast(1),
                    ConfigDef.Importance.LOW, "HTTP timeout for one registry request")
            .define(USER_INFO, ConfigDef.Type.PASSWORD, null, ConfigDef.Importance.HIGH,
                    "user:password for the registry's HTTP Basic authentication (gnomon's registry-reader)");

    private RegistryClient registry;
    private boolean json;
    private final AvroData avroData = new AvroData();
    private final Map<org.apache.avro.Schema, GenericDatumReader<Object>> readers =
            new java.util.concurrent.ConcurrentHashMap<>();

    @Override
    public ConfigDef config() {
        return CONFIG;
    }

    @Override
    public void configure(Map<String, ?> configs, boolean isKey) {
        AbstractConfig config = new AbstractConfig(CONFIG, configs);
        org.apache.kafka.common.config.types.Password userInfo = config.getPassword(USER_INFO);
        registry = new RegistryClient(config.getString(REGISTRY_URL), Duration.ofMillis(config.getLong(TIMEOUT_MS)),
                userInfo == null ? null : userInfo.value());
        json = "json".equals(config.getString(OUTPUT));
    }

    @Override
    public byte[] fromConnectData(String topic, Schema schema, Object value) {
        throw new DataException("gnomon.connect.RegistryAvroConverter only reads (topic " + topic + ")");
    }

    @Override
    public SchemaAndValue toConnectData(String topic, byte[] value) {
        if (value == null) {
            return SchemaAndValue.NULL;
        }
        if (value.length < 5 || value[0] != MAGIC) {
            throw new DataException("topic " + topic + ": not Confluent-framed Avro (" + value.length
                    + " bytes, first byte " + (value.length > 0 ? value[0] : -1) + ")");
        }
        int id = ByteBuffer.wrap(value, 1, 4).getInt();
        org.apache.avro.Schema writer = registry.schema(id);
        Object datum;
        try {
            BinaryDecoder decoder = DecoderFactory.get().binaryDecoder(value, 5, value.length - 5, null);
            datum = readers.computeIfAbsent(writer, GenericDatumReader::new).read(null, decoder);
            if (!decoder.isEnd()) {
                throw new DataException("topic " + topic + ": trailing bytes after the record (schema id " + id + ")");
            }
        } catch (IOException | RuntimeException e) {
            if (e instanceof DataException d) {
                throw d;
            }
            throw new DataException("topic " + topic + ": not Avro of schema id " + id + ": " + e, e);
        }
        Schema schema = avroData.connectSchema(writer);
        Object connectValue = avroData.toConnectValue(schema, datum);
        if (json) {
            return new SchemaAndValue(Schema.STRING_SCHEMA, JsonText.of(schema, connectValue));
        }
        return new SchemaAndValue(schema, connectValue);
    }
}
